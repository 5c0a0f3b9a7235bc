"""UsageChunkStripper: the client gets the upstream's bytes minus exactly the usage-only
event the proxy caused, however the stream was split into reads."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llmtop.proxy.dialects import UsageChunkStripper
from llmtop.proxy.dialects.openai import OpenAIStreamParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"


def strip(pieces: list[bytes], max_event_bytes: int = 1 << 20) -> tuple[bytes, list[bytes]]:
    s = UsageChunkStripper(max_event_bytes)
    outs = [s.filter(p) for p in pieces]
    outs.append(s.flush())
    return b"".join(outs), outs


def all_splits(raw: bytes) -> list[list[bytes]]:
    splits = [[raw[:i], raw[i:]] for i in range(len(raw) + 1)]
    splits.append([raw[i : i + 1] for i in range(len(raw))])
    rng = random.Random(len(raw))
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(raw)), k=rng.randint(1, min(30, len(raw) - 1))))
        splits.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)])
    return splits


def without_usage_event(raw: bytes, eol: bytes) -> bytes:
    """The expected client bytes, cut by hand: from the 'data:' line holding
    "choices":[] to the end of its blank line."""
    at = raw.index(b'"choices":[]')
    start = raw.rindex(b"data:", 0, at)
    end = raw.index(eol + eol, at) + 2 * len(eol)
    return raw[:start] + raw[end:]


USAGE_FIXTURES = {
    "llamacpp_chat_stream_usage.sse": b"\n",
    "openai_crlf_keepalive_tools.sse": b"\r\n",
    "openai_continuous_usage_reasoning.sse": b"\n",
}
NO_USAGE_EVENT = ["llamacpp_chat_stream.sse", "llamacpp_completions_stream.sse",
                  "openai_multiline_no_final_blank.sse", "openai_completions_cr.sse",
                  "openai_error_midstream.sse"]


@pytest.mark.parametrize("name", sorted(USAGE_FIXTURES))
def test_removes_exactly_the_usage_event_at_every_split(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    want = without_usage_event(raw, USAGE_FIXTURES[name])
    assert len(want) < len(raw)
    for pieces in all_splits(raw):
        got, _ = strip(pieces)
        assert got == want, [len(p) for p in pieces]


@pytest.mark.parametrize("name", NO_USAGE_EVENT)
def test_streams_without_a_usage_only_event_pass_unchanged(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    for pieces in all_splits(raw)[:: max(1, len(raw) // 300)]:
        assert strip(pieces)[0] == raw


def test_what_the_client_sees_parses_as_without_usage() -> None:
    raw = (FIXTURES / "llamacpp_chat_stream_usage.sse").read_bytes()
    client = strip([raw])[0]
    p = OpenAIStreamParser()
    p.feed(client)
    p.finish()
    assert not p.usage_seen and p.done
    # ...and matches what llama.cpp sends without include_usage, except ids and timings
    plain = (FIXTURES / "llamacpp_chat_stream.sse").read_bytes()
    assert client.count(b"\n\n") == plain.count(b"\n\n")


@pytest.mark.parametrize("name", sorted(USAGE_FIXTURES))
def test_a_usage_event_holding_more_than_usage_is_said(name: str) -> None:
    """llama.cpp moves its ``timings`` from the finish event into the usage event when asked
    for usage: removing it loses the client those fields, and the proxy must know (it then
    stops injecting for that upstream). The OpenAI API's usage events hold only usage."""
    s = UsageChunkStripper()
    s.filter((FIXTURES / name).read_bytes())
    s.flush()
    assert s.stripped
    assert s.extra_fields == name.startswith("llamacpp")


def test_complete_events_are_forwarded_on_the_same_read() -> None:
    raw = (FIXTURES / "llamacpp_chat_stream_usage.sse").read_bytes()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    s = UsageChunkStripper()
    for ev in events:
        out = s.filter(ev)
        if b'"choices":[]' in ev:
            assert out == b"" and s.stripped
        else:
            assert out == ev
    assert s.flush() == b""


def test_only_a_trailing_incomplete_event_is_held() -> None:
    s = UsageChunkStripper()
    done = b"data: [DONE]\n\n"
    usage = b'data: {"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":1}}\n\n'
    content = b'data: {"choices":[{"delta":{"content":"x"},"index":0}]}\n\n'
    # a complete event plus the first half of the next: the complete one goes out now
    assert s.filter(content + usage[:20]) == content
    assert s.buffered_bytes == 20
    assert s.filter(usage[20:]) == b""
    assert s.filter(done) == done
    assert s.stripped


def test_a_partial_event_with_choices_is_released_early() -> None:
    s = UsageChunkStripper()
    content = b'data: {"id":"c","choices":[{"delta":{"content":"x"},"index":0}]}\n\n'
    cut = content.index(b"{", content.index(b"choices")) + 1
    assert s.filter(content[:5]) == b""  # could still be anything
    assert s.filter(content[5:cut]) == content[:cut]  # "choices":[{ → cannot be usage-only
    assert s.filter(content[cut:]) == content[cut:]
    assert s.buffered_bytes == 0


def test_empty_choices_without_usage_and_null_usage_are_kept() -> None:
    raw = (b'data: {"choices":[],"usage":null}\n\n'
           b'data: {"choices":[]}\n\n'
           b'data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":1}}\n\n'
           b"data: [DONE]\n\n")
    for pieces in all_splits(raw):
        assert strip(pieces)[0] == raw


def test_every_usage_event_is_removed() -> None:
    """llama.cpp sends one per choice when n > 1 (see test_dialect_usage_n.py)."""
    u = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
    raw = u + u + b"data: [DONE]\n\n"
    assert strip([raw])[0] == b"data: [DONE]\n\n"


def test_crlf_split_between_cr_and_lf_of_the_dropped_event() -> None:
    usage = b'data: {"choices":[],"usage":{"completion_tokens":2}}\r\n\r\n'
    raw = b'data: {"choices":[{"text":"a"}]}\r\n\r\n' + usage + b"data: [DONE]\r\n\r\n"
    want = raw.replace(usage, b"")
    cut = raw.index(usage) + len(usage) - 1  # between the final \r and \n of the usage event
    assert strip([raw[:cut], raw[cut:]])[0] == want
    assert strip([raw])[0] == want


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_usage_event_without_blank_line_at_eof_is_removed(eol: bytes) -> None:
    head = b'data: {"choices":[{"text":"a"}]}' + eol + eol
    raw = head + b'data: {"choices":[],"usage":{"completion_tokens":2}}' + eol
    for pieces in all_splits(raw):
        assert strip(pieces)[0] == head


def test_multi_line_usage_event_and_comments_inside() -> None:
    ev = b': hi\ndata: {"choices": [ ],\ndata:  "usage": {"completion_tokens": 2}}\n\n'
    raw = b'data: {"choices":[{"text":"a"}]}\n\n' + ev + b"data: [DONE]\n\n"
    for pieces in all_splits(raw):
        assert strip(pieces)[0] == raw.replace(ev, b"")


def test_oversized_partial_event_is_released_unchanged() -> None:
    big = b"data: " + b"q" * 3000 + b"\n\n"
    s = UsageChunkStripper(max_event_bytes=1024)
    out = b"".join(s.filter(big[i : i + 100]) for i in range(0, len(big), 100)) + s.flush()
    assert out == big
    assert s.buffered_bytes == 0
