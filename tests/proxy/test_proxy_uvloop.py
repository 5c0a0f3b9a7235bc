"""The proxy on uvloop, the event loop ``llmtop run`` uses: pass-through, a slow client
(flow control), a client that leaves, an idle timeout."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import pytest
import uvloop
from test_proxy_support import Script, openai_chunks, read_chunks, running_proxy, scripted_upstream

SSE = {"Content-Type": "text/event-stream"}
CHAT = "/v1/chat/completions"


def on_uvloop(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test body on a uvloop event loop (each test its own loop)."""

    @functools.wraps(fn)
    def run() -> None:
        async def body() -> None:
            assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
            await fn()

        uvloop.run(body())

    return run


@on_uvloop
async def test_stream_passes_through_on_uvloop() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c"], usage={
            "prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}), headers=SSE,
            gap_s=0.01)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, json={"model": "m", "stream": True,
                                                "stream_options": {"include_usage": True}}) as r:
                got = await read_chunks(r)
            async with s.post(url + CHAT, json={"model": "m", "stream": True}) as r:
                stripped = await r.read()
            recs_ = await recs.wait(2)
    assert got == up.sent[0]
    assert b'"usage"' not in stripped and stripped.endswith(b"data: [DONE]\n\n")
    assert all(x.outcome == "ok" and x.completion_tokens == 3 for x in recs_)


@on_uvloop
async def test_slow_client_pauses_the_upstream_and_loses_nothing() -> None:
    big = [bytes([65 + i % 26]) * 65536 for i in range(64)]  # 4 MiB, much more than buffers
    async with scripted_upstream() as up:
        up.script = Script(chunks=big, headers={"Content-Type": "application/octet-stream"})
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            # the second request on the kept-alive connection is served directly
            for _ in range(2):
                async with s.post(url + "/blob") as r:
                    received = bytearray()
                    async for data in r.content.iter_chunked(65536):
                        received += data
                        await asyncio.sleep(0.002)  # a slow reader
                assert bytes(received) == b"".join(big)
            got = await recs.wait(2)
    assert proxy.direct_starts == 1
    assert [rec.outcome for rec in got] == ["ok", "ok"]


@on_uvloop
async def test_client_leaving_and_idle_timeout_on_uvloop() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks([str(i) for i in range(100)]), headers=SSE,
                           gap_s=0.02)
        async with running_proxy(up.url, timeouts__idle_s=0.3) as (_, url, recs), \
                aiohttp.ClientSession() as s:
            r = await s.post(url + CHAT, json={"model": "m", "stream": True,
                                                "stream_options": {"include_usage": True}})
            await r.content.readany()
            r.close()
            await up.wait_disconnect()
            up.script = Script(chunks=openai_chunks(["a", "b"]), headers=SSE, hang_after=2)
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(url + CHAT, json={"model": "m", "stream": True}) as r2:
                    await r2.read()
            recs_ = await recs.wait(2)
    assert [x.outcome for x in recs_] == ["cancelled", "timeout"]
