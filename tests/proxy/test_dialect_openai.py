"""OpenAI dialect: content rules, the no-json fast path, whole bodies, request helpers."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.openai import (
    OpenAIBodyParser,
    OpenAIStreamParser,
    _choices_have_content,
    add_include_usage,
    inspect_openai_request,
    is_usage_rejection,
)


def sse(*objs: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)


def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta}], **extra}


def feed(p: OpenAIStreamParser, data: bytes) -> tuple[int, int]:
    a = p.feed(data)
    b = p.finish()
    return (a[0] + b[0], a[1] + b[1])


def test_what_counts_as_content() -> None:
    cases: list[tuple[dict[str, Any], bool]] = [
        ({"role": "assistant"}, False),
        ({"role": "assistant", "content": None}, False),
        ({"role": "assistant", "content": ""}, False),
        ({}, False),
        ({"content": "x"}, True),
        ({"content": " "}, True),
        ({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}, True),
        ({"tool_calls": []}, False),
        ({"reasoning_content": "hmm"}, True),
        ({"reasoning": "hmm"}, True),
        ({"reasoning_content": "", "content": ""}, False),
        ({"refusal": "no"}, True),
        ({"function_call": {"name": "f"}}, True),
    ]
    for delta, want in cases:
        p = OpenAIStreamParser()
        # a first chunk names the model so the second one takes the fast path
        n, _ = feed(p, sse(chunk({"role": "assistant"}), chunk(delta)))
        assert n == (1 if want else 0), delta


def test_usage_only_and_finish_only_events_are_not_content() -> None:
    p = OpenAIStreamParser()
    data = sse(chunk({"content": "a"}),
               {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {},
                                                      "finish_reason": "stop"}]},
               {"id": "c", "model": "m", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1}}) + b"data: [DONE]\n\n"
    assert feed(p, data) == (1, 1)
    assert p.done and p.usage_seen
    assert (p.usage_prompt_tokens, p.usage_completion_tokens) == (3, 1)


def test_a_usage_count_past_max_tokens_is_no_usage() -> None:
    """An engine's counter bug (2**63 completion tokens) is read as no usage, as a negative
    count is: taken as it was, the metrics dropped the whole request (int64 overflow)."""
    from llmtop.proxy.dialects._common import MAX_TOKENS

    for n, taken in ((2**63, None), (10**400, None), (MAX_TOKENS + 1, None),
                     (MAX_TOKENS, MAX_TOKENS), (7, 7)):
        p = OpenAIStreamParser()
        feed(p, sse(chunk({"content": "a"}),
                    {"id": "c", "model": "m", "choices": [],
                     "usage": {"prompt_tokens": n, "completion_tokens": n}}))
        assert p.usage_completion_tokens == taken, n
        assert p.usage_prompt_tokens == taken, n


def test_continuous_usage_never_gives_negative_tokens() -> None:
    p = OpenAIStreamParser()
    u = lambda c: {"prompt_tokens": 1, "completion_tokens": c}  # noqa: E731
    data = sse(chunk({"content": "a"}, usage=u(2)), chunk({"content": "b"}, usage=u(1)),
               chunk({"content": "c"}, usage=u(4)))
    results = [p.feed(e + b"\n\n") for e in data.split(b"\n\n") if e]
    assert results == [(1, 2), (1, 0), (1, 2)]
    assert p.usage_completion_tokens == 4


def test_content_without_usage_between_usage_chunks_is_not_counted_twice() -> None:
    p = OpenAIStreamParser()
    u = lambda c: {"prompt_tokens": 1, "completion_tokens": c}  # noqa: E731
    data = sse(chunk({"content": "a"}, usage=u(1)), chunk({"content": "b"}),
               chunk({"content": "c"}, usage=u(4)))
    results = [p.feed(e + b"\n\n") for e in data.split(b"\n\n") if e]
    assert results == [(1, 1), (1, 1), (1, 2)]


def test_error_events() -> None:
    p = OpenAIStreamParser()
    feed(p, sse(chunk({"content": "a"}), {"error": {"message": "boom", "code": 500}},
                {"error": {"message": "second"}}))
    assert p.error == "boom", "the first error wins"
    p = OpenAIStreamParser()
    feed(p, sse(chunk({"content": "a"})) + b"event: error\ndata: upstream went away\n\n")
    assert p.error == "upstream went away"
    p = OpenAIStreamParser()
    feed(p, sse(chunk({"content": "a"}), {"object": "error", "message": "vllm says no"}))
    assert p.error == "vllm says no"
    p = OpenAIStreamParser()
    assert feed(p, b'data: {"choices":[{"delta":{"content":"a"\n\n') == (0, 0)
    assert p.error == "malformed JSON in stream event"


def test_long_error_messages_are_cut_to_one_short_line() -> None:
    p = OpenAIStreamParser()
    feed(p, sse({"error": {"message": "x\n" * 1000}}))
    assert p.error is not None and len(p.error) <= 300 and "\n" not in p.error


# -- the fast path (no json.loads) agrees with the full decode --------------------------

_text = st.one_of(st.just(""), st.text(max_size=8),
                  st.sampled_from(['"content":"x"', '\\"', '"', "}", "[{", '"text":"y"']))
_opt_text = st.one_of(st.none(), _text)
_delta = st.fixed_dictionaries({}, optional={
    "role": st.just("assistant"),
    "content": st.one_of(_opt_text, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": _text}), max_size=2)),
    "reasoning_content": _opt_text,
    "reasoning": _opt_text,
    "refusal": _opt_text,
    "tool_calls": st.one_of(st.none(), st.lists(st.fixed_dictionaries(
        {"index": st.just(0), "function": st.fixed_dictionaries(
            {}, optional={"name": _text, "arguments": _text})}), max_size=2)),
    "function_call": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"name": _text})),
})
_logprobs = st.one_of(st.none(), st.fixed_dictionaries({"content": st.lists(
    st.fixed_dictionaries({"token": _text, "logprob": st.just(-0.5)}), max_size=2)}))
_choice = st.one_of(
    st.fixed_dictionaries({"index": st.just(0), "delta": _delta, "logprobs": _logprobs,
                           "finish_reason": st.sampled_from([None, "stop"])}),
    st.fixed_dictionaries({"index": st.just(0), "text": _opt_text, "logprobs": st.none(),
                           "finish_reason": st.sampled_from([None, "length"])}),
)
_chunk = st.fixed_dictionaries(
    {"id": st.just("chatcmpl-1"), "object": st.just("chat.completion.chunk"),
     "model": st.just("m"), "choices": st.lists(_choice, max_size=2)},
    optional={"usage": st.none(), "system_fingerprint": _text},
)


@settings(max_examples=300, deadline=None)
@given(obj=_chunk, spaced=st.booleans(), ascii_only=st.booleans())
def test_fast_path_agrees_with_json(obj: dict[str, Any], spaced: bool, ascii_only: bool) -> None:
    seps = (", ", ": ") if spaced else (",", ":")
    event = b"data: " + json.dumps(obj, separators=seps, ensure_ascii=ascii_only).encode(
        "utf-8") + b"\n\n"
    p = OpenAIStreamParser()
    p.feed(sse(chunk({"role": "assistant"})))  # the model is known: the fast path is on
    assert p.model == "m"
    n, t = p.feed(event)
    want = _choices_have_content(obj["choices"], "delta")
    assert (n, t) == ((1, 1) if want else (0, 0))


@settings(max_examples=200, deadline=None)
@given(obj=_chunk, spaced=st.booleans())
def test_the_first_event_reads_the_same_off_its_bytes(obj: dict[str, Any], spaced: bool
                                                      ) -> None:
    """The first event's model is read off its bytes when written plainly (no full decode);
    the content verdict and the model are what the JSON says."""
    seps = (", ", ": ") if spaced else (",", ":")
    p = OpenAIStreamParser()
    n, t = p.feed(b"data: " + json.dumps(obj, separators=seps).encode() + b"\n\n")
    want = _choices_have_content(obj["choices"], "delta")
    assert (n, t) == ((1, 1) if want else (0, 0))
    assert p.model == obj["model"]


def test_a_model_with_escapes_is_decoded_in_full() -> None:
    p = OpenAIStreamParser()
    first = {"id": "c", "model": 'org/m "q"', "choices": [{"delta": {"content": "x"}}]}
    assert feed(p, sse(first)) == (1, 1)
    assert p.model == 'org/m "q"'


def test_the_usage_event_read_by_stripper_and_parser_is_decoded_once() -> None:
    from llmtop.proxy.dialects import _common

    event = {"id": "c", "model": "m", "choices": [], "usage": {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    raw = json.dumps(event).encode()
    first = _common.loads_event(raw)
    again = _common.loads_event(bytes(bytearray(raw)))  # equal bytes, another object
    assert first == event and again is first
    other = _common.loads_event(raw.replace(b'"m"', b'"n"'))
    assert other["model"] == "n" and _common.loads_event(raw) == event


# -- non-streaming bodies ----------------------------------------------------------------

def body(obj: Any, max_body_bytes: int = 1 << 20) -> tuple[OpenAIBodyParser, tuple[int, int]]:
    p = OpenAIBodyParser(max_body_bytes)
    raw = json.dumps(obj).encode()
    p.feed(raw[:10])
    p.feed(raw[10:])
    return p, p.finish()


def test_body_with_tool_calls_and_no_text_is_content() -> None:
    p, r = body({"model": "m", "choices": [{"message": {"role": "assistant", "content": None,
                                                         "tool_calls": [{"id": "1"}]}}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
    assert r == (1, 7) and p.model == "m" and p.usage_prompt_tokens == 5


def test_body_without_usage_counts_one_token_and_empty_message_none() -> None:
    assert body({"choices": [{"message": {"content": "hi"}}]})[1] == (1, 1)
    assert body({"choices": [{"message": {"content": ""}}]})[1] == (0, 0)
    assert body({"choices": [{"text": "legacy"}]})[1] == (1, 1)


def test_body_errors() -> None:
    p, r = body({"error": {"message": "Invalid model", "type": "invalid_request_error"}})
    assert r == (0, 0) and p.error == "Invalid model"
    p2 = OpenAIBodyParser()
    p2.feed(b"<html>502 Bad Gateway</html>")
    assert p2.finish() == (0, 0) and p2.error == "malformed JSON body"
    p3 = OpenAIBodyParser()
    assert p3.finish() == (0, 0) and p3.error is None


def test_oversized_body_is_dropped_and_counted_once() -> None:
    p, r = body({"choices": [{"message": {"content": "x" * 5000}}]}, max_body_bytes=1000)
    assert r == (1, 1) and p.error is None and p.buffered_bytes == 0


# -- request helpers ---------------------------------------------------------------------

def test_inspect_request() -> None:
    info = inspect_openai_request(json.dumps({
        "model": "gpt-4o", "user": "alice", "stream": True,
        "stream_options": {"include_usage": True}, "messages": []}).encode())
    assert info == RequestInfo(model="gpt-4o", user="alice", stream=True, wants_usage=True)
    assert inspect_openai_request(b'{"model": "m", "stream": "yes"}') == RequestInfo(model="m")
    for bad in (b"", b"{", b"[1,2]", b"\xff\xfe", b"null", b'{"model": 5, "user": []}',
                b"[" * 100000):
        assert inspect_openai_request(bad) == RequestInfo()


def test_add_include_usage_splices_without_touching_other_bytes() -> None:
    raw = b'  {"model": "m",\n "stream": true, "messages": [{"content": "h\\u00e9"}]}'
    out = add_include_usage(raw)
    assert out == b'  {"stream_options":{"include_usage":true},' + raw[3:]
    obj = json.loads(out)
    assert obj["stream_options"] == {"include_usage": True}
    assert obj["messages"] == json.loads(raw)["messages"]


def test_add_include_usage_merges_existing_options() -> None:
    out = add_include_usage(b'{"stream": true, "stream_options": {"continuous_usage_stats": true,'
                            b' "include_usage": false}, "model": "m"}')
    assert out is not None
    # continuous usage counts only with include_usage (vLLM): asked alone, it gave the
    # client no usage, so it is turned off as include_usage is added
    assert json.loads(out) == {"stream": True, "model": "m", "stream_options": {
        "continuous_usage_stats": False, "include_usage": True}}
    out = add_include_usage(b'{"stream": true, "stream_options": {"continuous_usage_stats":'
                            b' false}}')
    assert out is not None and json.loads(out)["stream_options"] == {
        "continuous_usage_stats": False, "include_usage": True}
    out = add_include_usage(b'{"stream": true, "stream_options": null}')
    assert out is not None and json.loads(out)["stream_options"] == {"include_usage": True}


def test_add_include_usage_not_applicable() -> None:
    for raw in (b'{"stream": false}', b'{"model": "m"}', b"not json", b"", b"[]",
                b'{"stream": true, "stream_options": {"include_usage": true}}',
                b'{"stream": true, "stream_options": "weird"}'):
        assert add_include_usage(raw) is None, raw


def test_is_usage_rejection() -> None:
    vllm = (b'{"object":"error","message":"[{\'type\': \'extra_forbidden\', \'loc\': '
            b'(\'body\', \'stream_options\')}]","type":"BadRequestError","code":400}')
    assert is_usage_rejection(400, vllm)
    assert is_usage_rejection(422, b'{"detail": "include_usage not permitted"}')
    assert not is_usage_rejection(500, vllm)
    assert not is_usage_rejection(400, b'{"error": "context length exceeded"}')
    assert not is_usage_rejection(400, b"")
