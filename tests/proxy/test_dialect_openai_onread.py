"""The OpenAI parser's one-event-per-read fast path gives what the full path gives.

The relay's common read is one whole ``data: {...}\\n\\n`` event; the parser decides it with a
few bytes operations. Here streams of mixed event shapes (content, role, finish, usage,
errors, ``data:{`` without a space, ``event:`` names, comments, ``\\r\\n``, multi-line data,
malformed JSON, ``[DONE]``) are fed one event per read and one byte per read (which never
takes the fast path): each event must be reported the same, and the end state must match.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.proxy.dialects.openai import OpenAIStreamParser


def _c(delta: dict[str, Any], **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": "x", "model": "m", "choices": [{"index": 0, "delta": delta}]}
    obj.update(extra)
    return json.dumps(obj, separators=(",", ":")).encode()


_BODIES = [
    _c({"content": "hi"}), _c({"content": ""}), _c({"content": None}), _c({"role": "assistant"}),
    _c({}, usage={"completion_tokens": 5, "prompt_tokens": 2}),
    _c({"content": "a"}, usage={"completion_tokens": 7, "prompt_tokens": 2}),
    _c({"reasoning_content": "r"}), _c({"tool_calls": [{"index": 0}]}),
    b'{"model":"m","choices":[],"usage":{"completion_tokens":9,"prompt_tokens":4}}',
    b'{"error":{"message":"Overloaded"}}', b'{"object":"error","message":"bad"}',
    b'{"choices":[{"delta":{"content":"x"}}]', b'{"choices":[{"delta":{"content":"x"}}]}}',
    b'{not json at all}', b"{}", b"[DONE]", b'{"choices":[{"text":"legacy"}]}',
    json.dumps({"model": "m", "choices": [{"delta": {"content": "s"}}]}).encode(),
]


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    body = draw(st.sampled_from(_BODIES))
    prefix = draw(st.sampled_from([b"data: ", b"data:", b"data:  "]))
    eol = draw(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n"]))
    head = draw(st.sampled_from([b"", b"", b"", b"event: error", b": keep-alive", b"id: 3"]))
    lines = [head] if head else []
    if draw(st.integers(0, 9)) == 0 and len(body) > 4:  # data split over two lines
        lines += [prefix + body[:3], prefix + body[3:]]
    else:
        lines.append(prefix + body)
    return b"".join(ln + eol for ln in lines) + eol


def _run(reads: list[list[bytes]]) -> tuple[list[tuple[int, int]], tuple[Any, ...]]:
    p = OpenAIStreamParser()
    per_event = []
    for event_reads in reads:
        n = t = 0
        for r in event_reads:
            a, b = p.feed(r)
            n, t = n + a, t + b
        per_event.append((n, t))
    per_event.append(p.finish())
    return per_event, (p.model, p.error, p.usage_prompt_tokens, p.usage_completion_tokens,
                       p.usage_seen, p.done, p.buffered_bytes)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(_event(), min_size=1, max_size=12))
def test_one_event_per_read_equals_one_byte_per_read(events: list[bytes]) -> None:
    whole_events = _run([[e] for e in events])
    bytewise = _run([[e[i : i + 1] for i in range(len(e))] for e in events])
    assert whole_events == bytewise


@settings(max_examples=400, deadline=None)
@given(events=st.lists(_event(), min_size=1, max_size=12),
       cuts=st.lists(st.integers(1, 4), min_size=12, max_size=12))
def test_several_events_per_read_equal_one_byte_per_read(events: list[bytes],
                                                         cuts: list[int]) -> None:
    """Reads of several whole events (a busy upstream's; the fast path for plain ones)
    report per read what the events report fed byte by byte, summed."""
    groups: list[list[bytes]] = []
    i = 0
    for k in cuts:
        if i >= len(events):
            break
        groups.append(events[i:i + k])
        i += k
    per_read, state = _run([[b"".join(g)] for g in groups])
    per_event, bstate = _run([[e[j : j + 1] for j in range(len(e))] for g in groups for e in g])
    summed: list[tuple[int, int]] = []
    j = 0
    for g in groups:
        part = per_event[j:j + len(g)]
        summed.append((sum(a for a, _ in part), sum(b for _, b in part)))
        j += len(g)
    summed.append(per_event[-1])
    assert (per_read, state) == (summed, bstate)


def test_plain_events_several_per_read_after_the_first() -> None:
    p = OpenAIStreamParser()
    role = b"data: " + _c({"role": "assistant"}) + b"\n\n"
    text = [b"data: " + _c({"content": c}) + b"\n\n" for c in "abc"]
    empty = b"data:" + _c({"content": ""}) + b"\n\n"
    assert p.feed(role) == (0, 0)
    assert p.feed(text[0] + empty + text[1] + text[2]) == (3, 3)
    assert p.feed(empty + empty) == (0, 0)
    # one of them an error: the whole read goes the full way, the error is seen
    assert p.feed(text[0] + b'data: {"error":{"message":"Overloaded"}}\n\n') == (1, 1)
    assert p.error == "Overloaded"


def test_malformed_event_mid_stream_is_still_detected_on_whole_event_reads() -> None:
    p = OpenAIStreamParser()
    assert p.feed(b"data: " + _c({"role": "assistant"}) + b"\n\n") == (0, 0)
    assert p.feed(b"data: " + _c({"content": "a"}) + b"\n\n") == (1, 1)  # the fast path
    assert p.error is None
    assert p.feed(b'data: {"choices":[{"delta":{"content":"b"}}]\n\n') == (0, 0)  # no "}"
    assert p.error == "malformed JSON in stream event"


def test_usage_and_error_events_are_decoded_on_whole_event_reads() -> None:
    p = OpenAIStreamParser()
    p.feed(b"data: " + _c({"role": "assistant"}) + b"\n\n")
    assert p.feed(b"data:" + _c({"content": "a"}) + b"\n\n") == (1, 1)
    assert p.feed(b"data: " + _c({"content": "b"}, usage={"completion_tokens": 4}) + b"\n\n") \
        == (1, 3)
    assert p.usage_completion_tokens == 4
    assert p.feed(b'data: {"error":{"message":"Overloaded"}}\n\n') == (0, 0)
    assert p.error == "Overloaded"


def test_a_streams_last_read_decides_its_plain_events_fast_and_the_rest_in_full() -> None:
    """A whole answer after the role event, in one read: plain content events, then the
    usage-only event and [DONE] (what a fast engine's last read holds). The plain ones are
    counted on the bytes, the rest decoded; the same as fed byte by byte."""
    role = b"data: " + _c({"role": "assistant"}) + b"\n\n"
    text = b"".join(b"data: " + _c({"content": c}) + b"\n\n" for c in "abcde")
    usage = b'data: {"model":"m","choices":[],"usage":{"completion_tokens":9,"prompt_tokens":4}}'
    tail = text + b"data: " + _c({}, finish_reason="stop") + b"\n\n" + usage + b"\n\n" \
        + b"data: [DONE]\n\n"
    p = OpenAIStreamParser()
    assert p.feed(role) == (0, 0)
    got = p.feed(tail)
    q = OpenAIStreamParser()
    want = [0, 0]
    for i in range(len(role + tail)):
        a, b = q.feed((role + tail)[i:i + 1])
        want[0] += a
        want[1] += b
    assert got == tuple(want) == (5, 5)
    assert (p.usage_completion_tokens, p.usage_prompt_tokens, p.done) == (9, 4, True)
    assert p.buffered_bytes == 0
    # an error after plain events in one read: the plain ones counted, the error seen
    r = OpenAIStreamParser()
    r.feed(role)
    assert r.feed(text + b'data: {"error":{"message":"Overloaded"}}\n\n') == (5, 5)
    assert r.error == "Overloaded"
