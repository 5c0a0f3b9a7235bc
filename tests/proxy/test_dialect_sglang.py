"""SGLang's native ``/generate``: telling it from TGI's by the request body, and the cases
the golden fixtures (tests/fixtures/dialects/sglang_*) do not cover."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from llmtop.proxy.dialects import detect_dialect, inspect_request, make_parser
from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.sglang import (
    META_ONLY_BYTES,
    SGLangBodyParser,
    SGLangStreamParser,
    _meta_only,
    is_sglang_request,
)


def j(o: Any) -> bytes:
    return json.dumps(o).encode()


def ev(o: Any) -> bytes:
    return b"data: " + j(o) + b"\n\n"


def run(p: StreamParser, data: bytes) -> tuple[int, int]:
    a = p.feed(data)
    b = p.finish()
    return (a[0] + b[0], a[1] + b[1])


def out(text: str, completion: int | None, finish: Any = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": "r", "finish_reason": finish, "prompt_tokens": 4}
    if completion is not None:
        meta["completion_tokens"] = completion
    return {"text": text, "output_ids": [1] * len(text), "meta_info": meta, **extra}


# -- which /generate is it -----------------------------------------------------------------

SGLANG_BODIES = [
    j({"text": "Hi", "sampling_params": {"max_new_tokens": 8}, "stream": True}),
    j({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}),
    j({"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 1}]}),  # a batch
    j({"input_embeds": [[0.1, 0.2]], "stream": False}),
    j({"sampling_params": {"temperature": 0}, "rid": "x"}),  # SGLang's (it answers 400)
    b'  {"rid": "r1", "text": "inputs", "stream": true}',  # "inputs" only as a value
    j({"pad": "x" * 200_000, "text": "Hi"}),
]
TGI_BODIES = [
    j({"inputs": "Hi", "parameters": {"max_new_tokens": 8}}),
    j({"inputs": "Say \"text\": hi", "parameters": {}}),  # "text" inside a string value
    j({"inputs": "Hi", "parameters": {"details": True}, "text": "stray"}),  # inputs wins
    b"",
    b"not json",
    b'["text"]',
    b'{"text": "unterminated',
    j({"prompt": "Hi"}),
]


@pytest.mark.parametrize("body", SGLANG_BODIES)
@pytest.mark.parametrize("path", ["/generate", "/sglang/generate/", "/generate?x=1"])
def test_generate_with_an_sglang_body_is_sglang(path: str, body: bytes) -> None:
    assert is_sglang_request(body)
    assert detect_dialect("POST", path, "application/json", body=body) == "sglang"
    # decided before the body is read: tgi, as before (the proxy asks again with the body)
    assert detect_dialect("POST", path, "application/json") == "tgi"


@pytest.mark.parametrize("body", TGI_BODIES)
def test_generate_with_any_other_body_stays_tgi(body: bytes) -> None:
    assert not is_sglang_request(body)
    assert detect_dialect("POST", "/generate", None, body=body) == "tgi"


def test_sglang_body_never_overrides_another_path_method_or_setting() -> None:
    body = SGLANG_BODIES[0]
    assert detect_dialect("POST", "/generate_stream", None, body=body) == "tgi"
    assert detect_dialect("POST", "/api/generate", None, body=body) == "ollama"
    assert detect_dialect("POST", "/v1/completions", None, body=body) == "openai"
    assert detect_dialect("POST", "/", None, body=body) == "other"
    assert detect_dialect("POST", "/vertex_generate", None, body=body) == "other"
    assert detect_dialect("GET", "/generate", None, body=body) == "other"
    assert detect_dialect("POST", "/generate", None, "tgi", body) == "tgi"
    assert detect_dialect("POST", "/anything", None, "sglang") == "sglang"


def test_sglang_request() -> None:
    assert inspect_request("sglang", "/generate", SGLANG_BODIES[0]) == RequestInfo(stream=True)
    assert inspect_request("sglang", "/generate", SGLANG_BODIES[1]).stream is False
    assert inspect_request("sglang", "/generate",
                           j({"text": "x", "model": "qwen", "stream": 1})) == RequestInfo(
        model="qwen", stream=False)  # SGLang's stream is a bool: 1 is not true here
    assert inspect_request("sglang", "/generate", b"[1]") == RequestInfo()


# -- streams -----------------------------------------------------------------------------

def test_abort_finish_is_an_error_with_its_kind() -> None:
    """A request the server gave up (``FINISH_ABORT``, e.g. too long a prompt) ends with a
    finish_reason of type abort: the stream failed, whatever it carried before."""
    abort = {"type": "abort", "message": "Input length (9000 tokens) exceeds the maximum",
             "status_code": 400, "err_type": "BadRequestError"}
    p = SGLangStreamParser()
    assert run(p, ev(out("Hi", 1)) + ev(out("Hi", 1, abort)) + b"data: [DONE]\n\n") == (1, 1)
    assert p.error == "Input length (9000 tokens) exceeds the maximum"
    assert p.error_kind == "BadRequestError/400"
    assert p.usage_completion_tokens == 1 and p.ended
    q = SGLangStreamParser()
    run(q, ev(out("", 0, {"type": "abort", "message": None, "status_code": None})))
    assert q.error == "aborted" and q.error_kind is None


def test_error_event_sets_error_without_kind_and_later_events_still_count() -> None:
    p = SGLangStreamParser()
    data = (ev(out("a", 1)) + ev({"error": {"message": "boom"}}) + ev(out("ab", 2))
            + b"data: [DONE]\n\n")
    assert run(p, data) == (2, 2)
    assert (p.error, p.error_kind, p.usage_completion_tokens) == ("boom", None, 2)


def test_without_completion_tokens_one_token_per_event_with_output() -> None:
    """Something SGLang-shaped that does not count: an event with text or ids is one token,
    an empty one none, and the usage stays unknown (the record says ``chunks``); the
    prompt's count is still read."""
    p = SGLangStreamParser()
    data = (ev(out("a", None)) + ev(out("", None)) + ev({"text": "", "output_ids": [7]})
            + ev({"text": "abc"}) + ev({"meta_info": {"prompt_tokens": 3}}))
    assert run(p, data) == (3, 3)
    assert (p.usage_completion_tokens, p.usage_seen, p.usage_prompt_tokens) == (None, False, 4)


def test_a_count_that_goes_down_or_repeats_adds_nothing() -> None:
    p = SGLangStreamParser()
    assert run(p, ev(out("abc", 3)) + ev(out("ab", 2)) + ev(out("abcd", 4))) == (2, 4)
    assert p.usage_completion_tokens == 4


def test_tokens_without_text_are_content() -> None:
    """The detokenizer holds back an incomplete UTF-8 character: the count goes up while
    the text does not; the engine produced the token, so the event is content."""
    p = SGLangStreamParser()
    assert run(p, ev(out("a", 1)) + ev(out("a", 2)) + ev(out("a\u00e9", 3))) == (3, 3)


def test_malformed_and_odd_events() -> None:
    p = SGLangStreamParser()
    data = (b"data: {\"text\": \n\n" + ev(out("a", 1)) + ev([1, 2]) + ev(out("ab", 2, index="x"))
            + b"data: [DONE]\n\n")
    assert run(p, data) == (2, 2)
    assert p.error == "malformed JSON in stream event" and p.ended


def test_events_split_at_every_byte_are_reported_on_the_read_that_ends_them() -> None:
    data = (ev(out("a", 1)) + ev(out("abcd", 4)) + ev(out("abcd", 4, {"type": "stop"}))
            + b"data: [DONE]\n\n")
    for i in range(len(data) + 1):
        p = SGLangStreamParser()
        first, second, end = p.feed(data[:i]), p.feed(data[i:]), p.finish()
        assert end == (0, 0)
        assert (first[0] + second[0], first[1] + second[1]) == (2, 4), i
        assert p.usage_completion_tokens == 4 and p.ended


# -- whole bodies ------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "want", "error", "kind"), [
    # _create_error_response: HTTP 400
    (j({"error": {"message": "Either text, input_ids or input_embeds should be provided."}}),
     (0, 0), "Either text, input_ids or input_embeds should be provided.", None),
    # FastAPI's validation error, as SGLang's handler words it
    (j({"object": "error", "message": "1 validation error", "type": "Bad Request",
        "param": None, "code": 400}), (0, 0), "1 validation error", "400"),
    (j(out("", 0)), (0, 0), None, None),  # max_new_tokens 0: nothing generated
    (j([out("ab", 2), {"error": {"message": "x"}}]), (1, 2), "x", None),
    (j(out("abc", None)), (1, 1), None, None),
])
def test_sglang_bodies(body: bytes, want: tuple[int, int], error: str | None,
                       kind: str | None) -> None:
    p = SGLangBodyParser()
    assert p.feed(body) == (0, 0)
    assert p.finish() == want
    assert (p.error, p.error_kind) == (error, kind)


def test_make_parser_reads_a_non_streamed_answer() -> None:
    p = make_parser("sglang", False, "application/json")
    assert isinstance(p, SGLangBodyParser)
    p.feed(j(out("abc", 3)))
    assert p.finish() == (1, 3)
    assert (p.usage_prompt_tokens, p.usage_completion_tokens) == (4, 3)


# -- large events: read by their meta_info alone -------------------------------------------

def compact(o: Any) -> bytes:
    """As SGLang's orjson writes it: no spaces."""
    return json.dumps(o, separators=(",", ":")).encode()


def test_meta_only_reads_the_last_member_of_sglangs_own_shape() -> None:
    meta = {"id": "r", "finish_reason": None, "prompt_tokens": 4, "completion_tokens": 9}
    text = 'said "meta_info":{"completion_tokens":1} and } and }}' + "x" * 2000
    one = compact({"text": text, "output_ids": [5] * 9, "meta_info": meta})
    assert _meta_only(one) == (meta, 0)
    assert _meta_only(compact({"text": text, "meta_info": meta, "index": 12})) == (meta, 12)
    for other in (
        json.dumps({"text": text, "meta_info": meta}).encode(),  # spaces: not orjson's
        compact({"text": text, "meta_info": meta, "prompt_token_ids": [1, 2]}),
        compact({"text": text, "meta_info": meta, "x": {"a": 1}}),
        compact({"text": text, "x": {"meta_info": meta}}),  # nested, not the member
        compact({"text": text, "meta_info": [meta]}),
        compact({"text": text, "meta_info": meta, "index": "1"}),
        one[:-2] + b"}",  # cut
    ):
        assert _meta_only(other) is None, other[-80:]


def _long_stream(spaces: bool, batch: bool = False) -> bytes:
    """300 tokens, 1 then 3 an event, the whole output so far in each (events grow past
    ``META_ONLY_BYTES``); with ``batch`` two sequences interleaved."""
    dump = (lambda o: json.dumps(o).encode()) if spaces else compact
    out = b""
    for done in [1, *range(4, 301, 3)]:
        for index in (0, 1) if batch else (None,):
            meta = {"id": "r", "finish_reason": None if done < 298 else {"type": "length"},
                    "prompt_tokens": 40 + (index or 0), "completion_tokens": done,
                    "cached_tokens": 0}
            o: dict[str, Any] = {"text": "word " * done, "output_ids": list(range(done)),
                                 "meta_info": meta}
            if index is not None:
                o["index"] = index
            out += b"data: " + dump(o) + b"\n\n"
    return out + b"data: [DONE]\n\n"


@pytest.mark.parametrize("batch", [False, True])
def test_large_events_count_the_same_either_way(batch: bool) -> None:
    """orjson's compact events (read by their meta_info once large) and the same events
    with spaces (decoded in full) give the same counts, however they are split."""
    fast, slow = _long_stream(False, batch), _long_stream(True, batch)
    assert max(len(e) for e in fast.split(b"\n\n")) > 2 * META_ONLY_BYTES
    want = (100 * (2 if batch else 1), 298 * (2 if batch else 1))
    rng = random.Random(batch)
    for data in (fast, slow):
        cuts = sorted(rng.sample(range(1, len(data)), 50))
        for pieces in ([data], [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]):
            p = SGLangStreamParser()
            got = [p.feed(piece) for piece in pieces] + [p.finish()]
            assert (sum(n for n, _ in got), sum(t for _, t in got)) == want
            assert p.usage_completion_tokens == want[1]
            assert p.usage_prompt_tokens == (81 if batch else 40)
            assert p.ended and p.error is None


def test_large_event_abort_and_missing_count_still_read() -> None:
    big = "y" * 2 * META_ONLY_BYTES
    abort = {"type": "abort", "message": "aborted by the server", "status_code": 503,
             "err_type": None}
    p = SGLangStreamParser()
    data = (b"data: " + compact({"text": big, "meta_info": {"completion_tokens": 2}})
            + b"\n\ndata: " + compact({"text": big, "meta_info": {"prompt_tokens": 3}})
            + b"\n\ndata: " + compact({"text": big, "meta_info": {
                "completion_tokens": 2, "finish_reason": abort}}) + b"\n\n")
    # 2 tokens; then no count (one token: the event has text); then the abort, no token
    assert run(p, data) == (2, 3)
    assert (p.error, p.error_kind) == ("aborted by the server", "503")
    assert p.usage_prompt_tokens == 3 and p.usage_completion_tokens == 2


def test_a_large_event_is_not_decoded_beyond_its_meta_info() -> None:
    """What the meta_info path saves, made visible: a large event's text is not decoded
    (here it is not even valid JSON), its count is read all the same; the same event when
    small is decoded in full and found malformed."""
    meta = compact({"prompt_tokens": 2, "completion_tokens": 5})
    large = b'{"text":"' + b"z" * META_ONLY_BYTES + b'\\q","meta_info":' + meta + b"}"
    p = SGLangStreamParser()
    assert run(p, b"data: " + large + b"\n\n") == (1, 5) and p.error is None
    small = b'{"text":"z\\q","meta_info":' + meta + b"}"
    q = SGLangStreamParser()
    assert run(q, b"data: " + small + b"\n\n") == (0, 0)
    assert q.error == "malformed JSON in stream event"


def test_meta_only_on_damaged_events_never_raises() -> None:
    good = compact({"text": "w " * META_ONLY_BYTES, "output_ids": [1, 2],
                    "meta_info": {"completion_tokens": 3, "finish_reason": None},
                    "index": 1})
    rng = random.Random(5)
    for _ in range(500):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data) - 120, len(data))  # damage the meta_info end
            data[at] = rng.choice(b'{}[],:"0123456789\\x\xff')
        got = _meta_only(bytes(data))
        assert got is None or (type(got[0]) is dict and type(got[1]) is int)
        p = SGLangStreamParser()
        n, t = run(p, b"data: " + bytes(data) + b"\n\n")
        assert (n, t) in ((0, 0), (1, 3)) or p.error is None


def test_one_large_event_a_read_gives_what_the_framer_gives() -> None:
    """The read-level path (one whole large event from an idle framer) and the framer's
    give the same per-read results, reads of whole events mixed with split ones."""
    data = _long_stream(False)
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    p = SGLangStreamParser()
    one_a_read = [p.feed(e) for e in events]
    assert p.finish() == (0, 0) and p.ended and p.usage_completion_tokens == 298
    assert sum(t for _, t in one_a_read) == 298
    assert [n for n, _ in one_a_read] == [1] * 100 + [0]  # [DONE] is no content
    q = SGLangStreamParser()
    mixed: list[tuple[int, int]] = []
    for i, e in enumerate(events):
        if i % 3 == 0:  # split: the framer holds the first half, then is idle again
            mixed.append(q.feed(e[: len(e) // 2]))
            mixed.append(q.feed(e[len(e) // 2 :]))
        else:
            mixed.append(q.feed(e))
    assert sum(n for n, _ in mixed) == 100 and sum(t for _, t in mixed) == 298
    assert q.usage_completion_tokens == 298 and q.error is None


def test_an_event_over_the_limit_is_discarded_on_every_path() -> None:
    event = (b"data: " + compact({"text": "v" * 3000, "meta_info": {"completion_tokens": 9}})
             + b"\n\n")
    first = b'data: {"text":"a","meta_info":{"completion_tokens":1}}\n\n'  # framer warm
    for pieces in ([first, event], [first, event[:100], event[100:]]):
        p = SGLangStreamParser(2000)
        got = [p.feed(piece) for piece in pieces] + [p.finish()]
        assert got[0] == (1, 1) and all(g == (0, 0) for g in got[1:])
        assert p.usage_completion_tokens == 1
        assert p.error is not None and "2000 bytes discarded" in p.error
