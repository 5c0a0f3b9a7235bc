"""SGLang's native ``/generate``: telling it from TGI's by the request body, and the cases
the golden fixtures (tests/fixtures/dialects/sglang_*) do not cover."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmtop.proxy.dialects import detect_dialect, inspect_request, make_parser
from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.sglang import (
    SGLangBodyParser,
    SGLangStreamParser,
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
