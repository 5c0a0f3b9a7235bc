"""llama.cpp's first stream through a fresh proxy keeps its ``timings``.

Why it lost them: llama.cpp's server adds ``timings`` to the *last* event of a choice's
final write (``deltas.back()``): the finish event when the client did not ask for usage,
but the usage-only event after it when ``stream_options.include_usage`` is set — and the
proxy, which added that option itself, removes that event whole. It then stopped injecting
for the upstream (the usage event held more than usage), so only the first streams (those
in flight before the first one ended) were hit — the first one always.

Now a response that says ``Server: llama.cpp`` gets a ``TimingsRestorer``: the finish
event is held until the next event's bytes are known, and the removed usage event's extra
members go back onto its end, byte for byte as llama.cpp wrote them. The bytes expected
here are built by hand from real captures (``tests/fixtures/dialects``, the same bytes as
``shared/fixtures/llamacpp``): llama.cpp's capture *with* usage, less its usage event, with
that event's ``,"timings":{...}`` before the finish event's last ``}`` — which is the layout
of its capture *without* usage (checked below).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_dialect_usage_n import llamacpp_n2
from test_proxy_support import Script, Seen, running_proxy, scripted_upstream

from llmtop.proxy.dialects.openai import OpenAIStreamParser
from llmtop.proxy.dialects.openai_usage import (
    TimingsRestorer,
    UsageChunkStripper,
    stripper_for,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
WITH_USAGE = (FIXTURES / "llamacpp_chat_stream_usage.sse").read_bytes()
WITHOUT_USAGE = (FIXTURES / "llamacpp_chat_stream.sse").read_bytes()
CHAT = "/v1/chat/completions"
LLAMACPP = {"Content-Type": "text/event-stream", "Server": "llama.cpp"}


def _events(raw: bytes) -> list[bytes]:
    return [b + b"\n\n" for b in raw.split(b"\n\n") if b]


def _usage_event(events: list[bytes]) -> bytes:
    (usage,) = [e for e in events if b'"choices":[]' in e]
    return usage


def llamacpp_without_usage(raw: bytes) -> bytes:
    """What llama.cpp sends for the same answer without ``include_usage``, by hand: the
    usage event out, its ``timings`` member (its bytes) at the end of the finish event."""
    events = _events(raw)
    usage = _usage_event(events)
    timings = usage[usage.index(b',"timings":{'):usage.rindex(b"}")]
    out = []
    for e in events:
        if e is usage:
            continue
        if b'"finish_reason":"' in e:
            e = e[:e.rindex(b"}")] + timings + b"}\n\n"
        out.append(e)
    return b"".join(out)


def _shape(value: Any) -> Any:
    """The keys of every object, in order, with the values left out (ids, times differ)."""
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    return type(value).__name__


def _splits(raw: bytes, seed: int) -> list[list[bytes]]:
    """Every two-read split, one byte a read, and 200 random many-read splits."""
    splits = [[raw[:i], raw[i:]] for i in range(len(raw) + 1)]
    splits.append([raw[i:i + 1] for i in range(len(raw))])
    rng = random.Random(seed)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(raw)), k=rng.randint(1, 40)))
        splits.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)])
    return splits


def restore(pieces: list[bytes]) -> tuple[bytes, TimingsRestorer]:
    s = TimingsRestorer()
    out = b"".join(s.filter(p) for p in pieces) + s.flush()
    return out, s


def test_the_hand_built_answer_has_the_layout_of_the_capture_without_usage() -> None:
    """The expectation itself: event for event, the keys (in order) of llama.cpp's own
    answer without ``include_usage`` — the finish event ends with ``timings``."""
    want = _events(llamacpp_without_usage(WITH_USAGE))
    plain = _events(WITHOUT_USAGE)
    assert len(want) == len(plain) == 14
    for a, b in zip(want, plain, strict=True):
        if a.startswith(b"data: {"):
            assert _shape(json.loads(a[6:])) == _shape(json.loads(b[6:]))
        else:
            assert a == b
    assert b'"timings"' in want[-2] and list(json.loads(want[-2][6:]))[-1] == "timings"


def test_the_finish_event_gets_its_timings_back_at_every_split() -> None:
    want = llamacpp_without_usage(WITH_USAGE)
    assert b'"usage"' not in want and want.count(b'"timings"') == 1
    for pieces in _splits(WITH_USAGE, 1):
        got, s = restore(pieces)
        assert got == want, [len(p) for p in pieces]
        assert s.removed == 1 and s.restored == 1 and s.extra_fields
        assert s.buffered_bytes == 0


def test_the_plain_stripper_still_loses_them() -> None:
    """(What every other upstream's stripper does, and what the first llama.cpp stream
    got before: the usage event removed whole, ``timings`` and all.)"""
    s = UsageChunkStripper()
    got = s.filter(WITH_USAGE) + s.flush()
    assert b'"timings"' not in got and s.extra_fields


def test_each_choice_of_n2_gets_its_own_timings_back_at_every_split() -> None:
    """``n: 2``: llama.cpp sends each choice's finish event and usage event together as that
    choice ends (the first while the other still streams). The client gets exactly the
    answer without usage: each finish event with its own choice's ``timings``."""
    raw = b"".join(e for _, e in llamacpp_n2(True))
    want = b"".join(e for _, e in llamacpp_n2(False))
    assert raw.count(b'"choices":[]') == 2 and want.count(b'"timings"') == 2
    for pieces in _splits(raw, 2)[::3]:
        got, s = restore(pieces)
        assert got == want, [len(p) for p in pieces]
        assert s.removed == 2 and s.restored == 2


def test_a_finish_event_is_held_only_until_the_next_event_shows() -> None:
    """Held: only a complete finish event (its usage event may follow); it goes out with
    the next read, as it was, when that read is not a usage event. Content goes out at
    once, as with the plain stripper."""
    events = _events(WITHOUT_USAGE)  # finish event with timings already, then [DONE]
    s = TimingsRestorer()
    for e in events[:-2]:
        assert s.filter(e) == e  # role and content chunks: at once
    finish, done = events[-2], events[-1]
    assert s.filter(finish) == b"" and s.buffered_bytes == len(finish)
    assert s.filter(done) == finish + done
    assert s.flush() == b"" and s.restored == 0 and not s.stripped


def test_a_finish_event_that_ends_the_body_goes_out_at_its_end() -> None:
    finish = _events(WITHOUT_USAGE)[-2]
    s = TimingsRestorer()
    assert s.filter(finish) == b""
    assert s.flush() == finish


def test_extra_fields_after_something_else_than_a_finish_event_are_lost_as_before() -> None:
    """Not llama.cpp's layout (the event before the usage event is no finish event): the
    usage event is removed, nothing is rewritten."""
    content = _events(WITH_USAGE)[1]
    usage = _usage_event(_events(WITH_USAGE))
    got, s = restore([content + usage + b"data: [DONE]\n\n"])
    assert got == content + b"data: [DONE]\n\n"
    assert s.extra_fields and s.restored == 0 and s.removed == 1


@pytest.mark.parametrize(("headers", "kind"), [
    ([(b"Server", b"llama.cpp")], TimingsRestorer),
    ([(b"server", b"llama.cpp")], TimingsRestorer),
    ([(b"Server", b"Python/3.12 aiohttp/3.9")], UsageChunkStripper),
    ([], UsageChunkStripper),
])
def test_the_stripper_follows_the_server_field(headers: list[tuple[bytes, bytes]],
                                               kind: type) -> None:
    assert type(stripper_for(headers)) is kind


# -- through the proxy ----------------------------------------------------------------------


def llamacpp(seen: Seen) -> Script:
    """The real capture's events, as llama-server writes them: asked for usage, the
    finish and usage events in one write; else the finish event with ``timings``."""
    asked = (json.loads(seen.body).get("stream_options") or {}).get("include_usage") is True
    events = _events(WITH_USAGE)
    if asked:
        chunks = [*events[:-3], events[-3] + events[-2], events[-1]]
    else:
        chunks = _events(llamacpp_without_usage(WITH_USAGE))
    return Script(chunks=chunks, headers=LLAMACPP)


async def test_the_first_stream_through_a_fresh_proxy_is_byte_exact() -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    want = llamacpp_without_usage(WITH_USAGE)
    async with scripted_upstream() as up:
        up.responder = llamacpp
        async with running_proxy(up.url) as (proxy, url, recs), \
                aiohttp.ClientSession() as s:
            got = []
            for _ in range(2):
                async with s.post(url + CHAT, json=body) as r:
                    got.append(await r.read())
            records = await recs.wait(2)
        assert proxy.usage_rejected  # llama.cpp counts itself: no need to ask again
    asked = [b"include_usage" in seen.body for seen in up.seen]
    assert asked == [True, False]
    assert got[0] == want  # the first stream too: its finish event with llama.cpp's timings
    assert got[1] == want
    usage = json.loads(_usage_event(_events(WITH_USAGE))[6:])["usage"]
    for r in records:  # the engine's counts either way (usage, then timings)
        assert r.outcome == "ok" and r.token_source == "usage"
        assert r.completion_tokens == usage["completion_tokens"] == 12
        assert r.prompt_tokens == usage["prompt_tokens"] == 36


async def test_the_parser_still_reads_the_engines_counts_from_the_usage_event() -> None:
    """(The relay feeds the parser the upstream's bytes, not the client's: the first
    stream is counted from the usage event the client does not see.)"""
    p = OpenAIStreamParser()
    p.feed(WITH_USAGE)
    p.finish()
    assert p.usage_completion_tokens == 12 and p.usage_prompt_tokens == 36


@pytest.mark.parametrize("name", [
    "llamacpp_chat_stream.sse", "llamacpp_completions_stream.sse",
    "openai_multiline_no_final_blank.sse", "openai_completions_cr.sse",
    "openai_error_midstream.sse", "openai_crlf_keepalive_tools.sse",
    "openai_continuous_usage_reasoning.sse",
])
def test_anything_else_comes_out_as_the_plain_stripper_gives_it(name: str) -> None:
    """Holding a finish event back changes when its bytes go out, never which: streams
    without a usage event pass unchanged, and usage events without extra fields are
    removed as the plain stripper removes them, at every split."""
    raw = (FIXTURES / name).read_bytes()
    plain = UsageChunkStripper()
    want = plain.filter(raw) + plain.flush()
    for pieces in _splits(raw, 3)[:: max(1, len(raw) // 400)]:
        got, s = restore(pieces)
        assert got == want, [len(p) for p in pieces]
        assert s.restored == 0 and s.buffered_bytes == 0
