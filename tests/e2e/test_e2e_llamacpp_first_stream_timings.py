"""The first chat stream through a fresh ``llmtop run --headless`` in front of the real
llama.cpp server keeps llama.cpp's ``timings``.

llmtop adds ``stream_options.include_usage`` to a stream whose client did not ask for
usage, until an answer shows the upstream counts for itself. llama.cpp then moves its
``timings`` from each choice's finish event into the usage-only event after it (its server
adds ``timings`` to the last event it writes for a choice), and llmtop removes that event:
the first stream's client got no ``timings`` at all. Now llmtop puts them back at the end
of the finish event, so the client's bytes are llama.cpp's own answer without
``include_usage``; the record counts the engine's usage. From the second stream on llmtop
does not ask any more, and the bytes pass through whole.

engine ← Tee ← llmtop ← client: the tee keeps the bytes llmtop read from the engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from e2e_support import (
    CHAT,
    MODEL,
    USER_HEADER,
    LlmtopProcess,
    Tee,
    has_usage_only_event,
    llamacpp_without_usage,
    new_user,
    sse_events,
    teed_llmtop,
    timings_of,
    usage_of,
    wait_engine_idle,
)

PATH = "/v1/chat/completions"


@pytest.fixture
async def teed(engine: Any, tmp_path: Path) -> AsyncIterator[tuple[Tee, LlmtopProcess]]:
    """engine ← Tee ← llmtop ← client (a fresh llmtop: it has learnt nothing yet)."""
    async with teed_llmtop(engine.url, tmp_path / "first.jsonl") as pair:
        yield pair


def _shape(value: Any) -> Any:
    """The keys of every object, in order, values left out (ids, times, text differ)."""
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    return type(value).__name__


def _shapes(body: bytes) -> list[Any]:
    return [p if p == b"[DONE]" else _shape(json.loads(p)) for p in sse_events(body)]


async def _stream(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                  user: str) -> bytes:
    got = bytearray()
    async with session.post(url + PATH, json=payload, headers={USER_HEADER: user}) as resp:
        assert resp.status == 200, await resp.text()
        async for data in resp.content.iter_any():
            got += data
    return bytes(got)


@pytest.mark.parametrize("n", [1, 2])
async def test_the_first_stream_keeps_llamacpps_timings(
    engine: Any, teed: tuple[Tee, LlmtopProcess], n: int
) -> None:
    tee, proc = teed
    payload: dict[str, Any] = {
        "model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 12,
        "temperature": 0, "seed": 1, "n": n,
    }  # fmt: skip
    users = [new_user(f"first-n{n}"), new_user(f"second-n{n}")]
    got: list[bytes] = []
    upstream: list[bytes] = []
    sent: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        await wait_engine_idle(session, engine.url)
        # straight from the engine, as the client would get it without llmtop
        direct = await _stream(session, engine.url, payload, new_user("direct"))
        for user in users:
            await wait_engine_idle(session, engine.url)
            before = len(tee.exchanges)
            got.append(await _stream(session, proc.proxy_url, payload, user))
            (ex,) = [e for e in tee.exchanges[before:] if e.path == PATH]
            upstream.append(bytes(ex.response_body))
            sent.append(json.loads(ex.request_body))

    # the first stream: llmtop asked for usage, llama.cpp moved its timings into the
    # usage-only event (one per choice) ...
    assert sent[0]["stream_options"] == {"include_usage": True}
    assert has_usage_only_event(upstream[0])
    usage_events = [p for p in sse_events(upstream[0])
                    if p != b"[DONE]" and json.loads(p).get("choices") == []]
    assert len(usage_events) == n
    assert all(b'"timings"' in p for p in usage_events)
    # ... and the client got them back on each finish event, byte for byte as llama.cpp
    # writes them when not asked for usage (before: no timings at all)
    assert got[0] == llamacpp_without_usage(upstream[0])
    assert not has_usage_only_event(got[0]) and usage_of(got[0]) is None
    finishes = [json.loads(p) for p in sse_events(got[0])
                if p != b"[DONE]" and json.loads(p)["choices"][0].get("finish_reason")]
    assert len(finishes) == n and all("timings" in f for f in finishes)
    assert timings_of(got[0]) == timings_of(upstream[0])
    if n == 1:  # one choice: the very layout of the engine's own answer without usage
        assert _shapes(got[0]) == _shapes(direct)
    else:  # (two choices interleave as they please: each event's layout)
        assert sorted(map(repr, _shapes(got[0]))) == sorted(map(repr, _shapes(direct)))

    # the second stream: llmtop no longer asks; the bytes pass through whole
    assert "stream_options" not in sent[1]
    assert got[1] == upstream[1] and b'"timings"' in got[1]

    first, second = await proc.records_for(users)
    usage = [json.loads(p)["usage"] for p in usage_events]
    assert first["token_source"] == "usage" and first["outcome"] == "ok"
    assert first["completion_tokens"] == sum(u["completion_tokens"] for u in usage)
    assert first["prompt_tokens"] == usage[0]["prompt_tokens"]  # the same prompt: once
    timings = [f["timings"] for f in finishes]
    assert first["completion_tokens"] == sum(t["predicted_n"] for t in timings)
    assert second["token_source"] == "usage" and second["outcome"] == "ok"
    assert second["prompt_tokens"] == first["prompt_tokens"]
