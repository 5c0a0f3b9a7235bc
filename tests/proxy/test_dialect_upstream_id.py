"""The engine's id of an answer (``response_id``, the record's ``upstream_id`` when the
response has no ``X-Request-Id``): the *top-level* id of an OpenAI-style stream's first
chunk — not a tool call's, whichever order the engine writes its keys in — at every byte
boundary, cut and made safe like the model; and the ``X-Request-Id`` the response head
picks out; SGLang's ``meta_info.id``. (Every dialect fixture's id, at every split:
test_dialect_fixtures.py.)"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from llmtop.proxy.dialects import make_parser
from llmtop.proxy.dialects._common import MAX_UPSTREAM_ID_CHARS
from llmtop.proxy.dialects.openai import OpenAIStreamParser
from llmtop.proxy.upstream_head import parse_head


def sse(obj: Any, seps: tuple[str, str] = (",", ":")) -> bytes:
    return b"data: " + json.dumps(obj, separators=seps).encode() + b"\n\n"


def every_split(raw: bytes) -> list[list[bytes]]:
    """Every two-read split, and one read per byte."""
    return [[raw[:i], raw[i:]] for i in range(len(raw) + 1)] + [
        [raw[i:i + 1] for i in range(len(raw))]]


def parsed(pieces: list[bytes]) -> OpenAIStreamParser:
    p = OpenAIStreamParser()
    for piece in pieces:
        p.feed(piece)
    p.finish()
    return p


_TOOL = {"index": 0, "delta": {"role": "assistant", "tool_calls": [
    {"index": 0, "id": "call_7", "type": "function",
     "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": None}
_TEXT = {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}


def _stream(first: dict[str, Any], seps: tuple[str, str] = (",", ":")) -> bytes:
    rest = {k: v for k, v in first.items() if k != "choices"}
    return (sse(first, seps) + sse({**rest, "choices": [_TEXT]}, seps)
            + sse({**rest, "choices": [], "usage": {"prompt_tokens": 3,
                                                    "completion_tokens": 2}}, seps)
            + b"data: [DONE]\n\n")


@pytest.mark.parametrize("layout", ["id first (vLLM, OpenAI)", "choices first (llama.cpp)",
                                    "spaced"])
def test_the_top_level_id_is_read_at_every_split_not_a_tool_calls(layout: str) -> None:
    """A first chunk that opens with a tool call carries the call's id too: the answer's
    id is the top-level one, in vLLM's key order and in llama.cpp's (``choices`` first,
    the ``id`` after them)."""
    if layout.startswith("choices first"):
        first: dict[str, Any] = {"choices": [_TOOL], "created": 1, "id": "chatcmpl-L1",
                                 "model": "m", "object": "chat.completion.chunk"}
    else:
        first = {"id": "chatcmpl-L1", "object": "chat.completion.chunk", "created": 1,
                 "model": "m", "choices": [_TOOL]}
    raw = _stream(first, (", ", ": ") if layout == "spaced" else (",", ":"))
    for pieces in every_split(raw):
        p = parsed(pieces)
        assert (p.response_id, p.model, p.ended) == ("chatcmpl-L1", "m", True), pieces


def test_the_role_chunk_of_llamacpp_gives_its_id_before_the_stream_ends() -> None:
    """The live row asks mid-stream: the id is there once the first event has come."""
    raw = _stream({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None},
                                "finish_reason": None}],
                   "created": 1, "id": "chatcmpl-R", "model": "m"})
    first = raw[:raw.index(b"\n\n") + 2]
    for i in range(len(first)):
        p = OpenAIStreamParser()
        p.feed(first[:i])
        assert p.response_id is None  # (the event is not whole yet)
        p.feed(first[i:])
        assert p.response_id == "chatcmpl-R"


def test_an_id_only_a_later_event_names_is_read_from_that_event() -> None:
    first = {"object": "chat.completion.chunk", "model": "m", "choices": [_TEXT]}
    raw = (sse(first) + sse({**first, "id": "chatcmpl-late", "choices": [],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}}))
    for pieces in every_split(raw):
        assert parsed(pieces).response_id == "chatcmpl-late"
    assert parsed([sse(first), sse(first)]).response_id is None  # no id anywhere


def test_the_first_events_id_stays_the_answers() -> None:
    one = {"id": "chatcmpl-1", "model": "m", "choices": [_TEXT]}
    p = parsed([sse(one), sse({**one, "id": "chatcmpl-2", "choices": [],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1}})])
    assert p.response_id == "chatcmpl-1"


@pytest.mark.parametrize(("value", "want"), [
    ('chat\\"cmpl-q', 'chat"cmpl-q'),  # escaped: decoded
    ("x" * 400, "x" * MAX_UPSTREAM_ID_CHARS),  # cut to 128
    ("id-\\udcff", "id-\ufffd"),  # a lone surrogate: one U+FFFD, as in a model
    ("id-\\ud83d\\ude00", "id-\U0001f600"),  # a surrogate pair: its character
    ("", None),
])
def test_odd_ids_are_cut_and_made_safe_text(value: str, want: str | None) -> None:
    raw = (b'data: {"id":"' + value.encode() + b'","model":"m","choices":[{"delta":'
           b'{"content":"a"}}]}\n\n')
    p = parsed([raw])
    assert p.response_id == want
    body = make_parser("openai", False, "application/json")
    body.feed(b'{"id":"' + value.encode() + b'","model":"m","choices":[]}')
    body.finish()
    assert body.response_id == want
    if want is not None:
        want.encode("utf-8")  # every output can carry it


@pytest.mark.parametrize("value", [b"7", b"null", b'{"a":"b"}', b'["chatcmpl-1"]'])
def test_an_id_that_is_not_a_string_is_none(value: bytes) -> None:
    raw = b'data: {"id":' + value + b',"model":"m","choices":[{"delta":{"content":"a"}}]}\n\n'
    assert parsed([raw]).response_id is None


def test_a_large_first_event_gives_its_id_too() -> None:
    """A first event past 4 KiB is not held for its id: it is read at once."""
    big = {"id": "chatcmpl-big", "model": "m",
           "choices": [{"index": 0, "delta": {"content": "y" * 10_000}}]}
    p = OpenAIStreamParser()
    assert p.feed(sse(big)) == (1, 1)
    assert p.response_id == "chatcmpl-big"


def test_a_compressed_answer_names_its_id() -> None:
    raw = _stream({"id": "chatcmpl-gz", "model": "m", "choices": [_TEXT]})
    p = make_parser("openai", True, "text/event-stream")
    from llmtop.proxy.dialects.compressed import InflatingParser

    z = InflatingParser(p, "gzip")
    packed = gzip.compress(raw)
    for i in range(0, len(packed), 7):
        z.feed(packed[i:i + 7])
    z.finish()
    assert z.response_id == "chatcmpl-gz"


def test_anthropic_and_the_responses_api_name_theirs_in_their_first_event() -> None:
    a = make_parser("anthropic", True, "text/event-stream")
    a.feed(b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_9",'
           b'"type":"message","model":"claude","usage":{"input_tokens":3}}}\n\n')
    assert a.response_id == "msg_9"
    a.feed(b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
           b'"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}\n\n')
    assert a.response_id == "msg_9"  # not the tool block's id
    r = make_parser("openai", True, "text/event-stream", "/v1/responses")
    r.feed(b'event: response.created\ndata: {"type":"response.created","response":'
           b'{"id":"resp_9","object":"response","model":"m","output":[]}}\n\n')
    assert r.response_id == "resp_9"
    r.feed(b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
           b'"item":{"id":"msg_1","type":"message"}}\n\n')
    assert r.response_id == "resp_9"


# -- SGLang's /generate: meta_info.id ----------------------------------------------------

RID = "0f8c2c3e5a3b4c1d9e7f6a5b4c3d2e1f"  # SGLang's rid: uuid4().hex unless the client gave one


def sglang_event(text: str, done: int, rid: str = RID, finish: object = None,
                 index: int | None = None) -> bytes:
    """One output event as SGLang writes it (orjson: no spaces; the output so far)."""
    meta = {"id": rid, "finish_reason": finish, "prompt_tokens": 7,
            "weight_version": "default", "completion_tokens": done, "cached_tokens": 0}
    out: dict[str, Any] = {"text": text, "output_ids": list(range(100, 100 + done)),
                           "meta_info": meta}
    if index is not None:
        out["index"] = index
    return sse(out)


@pytest.mark.parametrize("first_len", [6, 1500], ids=["small", "past META_ONLY_BYTES"])
def test_sglang_names_meta_info_id_at_every_split(first_len: int) -> None:
    """The id is ``meta_info.id``, read at every byte boundary; a first event past
    ``META_ONLY_BYTES`` (read by its ``meta_info`` alone, on the fast path when whole)
    names it too."""
    from llmtop.proxy.dialects.sglang import META_ONLY_BYTES, SGLangStreamParser

    text = "P" * first_len
    first = sglang_event(text, 1)
    assert (len(first) >= META_ONLY_BYTES) == (first_len > 1000)
    raw = (first + sglang_event(text + " is", 2)
           + sglang_event(text + " is", 2, finish={"type": "length", "length": 2})
           + b"data: [DONE]\n\n")
    whole = SGLangStreamParser()
    assert whole.feed(first) == (1, 1)
    assert whole.response_id == RID  # the live row asks after the first event
    for pieces in every_split(raw):
        p = make_parser("sglang", True, "text/event-stream", "/generate")
        got = [p.feed(piece) for piece in pieces] + [p.finish()]
        assert (p.response_id, p.usage_completion_tokens, p.ended) == (RID, 2, True), pieces
        assert sum(t for _, t in got) == 2


def test_sglang_batch_names_its_first_outputs_id_and_odd_ids_are_none() -> None:
    raw = (sglang_event("A", 1, "b_0", index=0) + sglang_event("B", 1, "b_1", index=1)
           + sglang_event("AB", 2, "b_0", index=0) + b"data: [DONE]\n\n")
    for pieces in every_split(raw):
        p = make_parser("sglang", True, "text/event-stream", "/generate")
        for piece in pieces:
            p.feed(piece)
        p.finish()
        assert p.response_id == "b_0", pieces
    body = make_parser("sglang", False, "application/json", "/generate")
    body.feed(b"[" + sglang_event("A", 1, "b_0")[6:-2] + b","
              + sglang_event("B", 1, "b_1")[6:-2] + b"]")
    body.finish()
    assert body.response_id == "b_0"
    for odd in (None, "", 7):
        p = make_parser("sglang", True, "text/event-stream", "/generate")
        p.feed(sglang_event("a", 1, odd) + sglang_event("ab", 2, odd))  # type: ignore[arg-type]
        assert (p.response_id, p.usage_completion_tokens) == (None, 2), odd
    long = make_parser("sglang", False, "application/json", "/generate")
    long.feed(sglang_event("a", 1, "r" * 300)[6:-2])
    long.finish()
    assert long.response_id == "r" * MAX_UPSTREAM_ID_CHARS


@pytest.mark.parametrize(("dialect", "path", "body"), [
    ("ollama", "/api/chat", b'{"model":"l","message":{"role":"assistant","content":"a"},'
                            b'"done":true,"eval_count":1}'),
    ("tgi", "/generate", b'{"generated_text":"a","details":{"generated_tokens":1}}'),
])
def test_ollama_and_tgi_name_none(dialect: str, path: str, body: bytes) -> None:
    p = make_parser(dialect, False, "application/json", path)  # type: ignore[arg-type]
    p.feed(body)
    p.finish()
    assert p.response_id is None


# -- the response head's X-Request-Id ------------------------------------------------------

def _head(*fields: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream" + b"".join(
        b"\r\n" + f for f in fields)


@pytest.mark.parametrize(("fields", "want"), [
    ((b"X-Request-Id: req-1",), "req-1"),
    ((b"x-request-id:   req-2  ",), "req-2"),  # any case; the value without its spaces
    ((b"X-REQUEST-ID: ", b"X-Request-Id: req-3", b"x-request-id: req-4"), "req-3"),
    ((b"X-Request-Id: a", b" b"), "a b"),  # folded: as folded
    ((b"X-Request-Id: " + b"r" * 300,), "r" * MAX_UPSTREAM_ID_CHARS),
    ((b"X-Request-Id: caf\xc3\xa9-\xff",), "caf\u00e9-\ufffd"),  # not UTF-8: U+FFFD
    ((b"X-Request-Ids: no", b"Request-Id: no"), None),
    ((), None),
])
def test_the_head_picks_out_x_request_id(fields: tuple[bytes, ...], want: str | None) -> None:
    head = parse_head(_head(*fields), False)
    assert head.request_id == want
    assert head.content_type == "text/event-stream"
    # passed on to the client as it came
    assert [n.lower() for n, _ in head.headers].count(b"x-request-id") == sum(
        f.lower().startswith(b"x-request-id:") for f in fields)
