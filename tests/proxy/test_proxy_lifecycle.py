"""Start, serve for long, shut down: no leaks, graceful deadline for streams in flight."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest
from test_proxy_support import (
    Script,
    Seen,
    openai_chunks,
    running_proxy,
    scripted_upstream,
)

from llmtop.bus import EventBus
from llmtop.config import ConfigError, load_config
from llmtop.proxy.server import ProxyServer

SSE = {"Content-Type": "text/event-stream"}
CHAT = "/v1/chat/completions"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_thousand_sequential_requests_leak_no_fds_or_memory() -> None:
    stream = openai_chunks(["a", "b", "c"], usage={"prompt_tokens": 1, "completion_tokens": 3,
                                                   "total_tokens": 4})

    def respond(seen: Seen) -> Script:
        if seen.path_qs.startswith("/v1/models"):
            return Script(chunks=[b'{"data": []}'], content_length=True)
        if seen.path_qs.startswith("/bad"):
            return Script(chunks=[b'{"error": "no"}'], status=500, content_length=True)
        return Script(chunks=stream, headers=SSE)

    async with scripted_upstream() as up:
        up.responder = respond
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            async def batch(n: int) -> None:
                for i in range(n):
                    kind = i % 3
                    if kind == 0:
                        async with s.post(url + CHAT, json={"model": "m", "stream": True}) as r:
                            assert r.status == 200
                            await r.read()
                    elif kind == 1:
                        async with s.get(url + "/v1/models") as r:
                            assert r.status == 200
                            await r.read()
                    else:
                        async with s.post(url + "/bad", data=b"{}") as r:
                            assert r.status == 500
                            await r.read()
                    if i % 100 == 99:
                        await recs.wait(len(recs.items))
                        recs.items.clear()
                        up.seen.clear()
                        up.sent.clear()
                        up.send_times.clear()

            await batch(150)  # warm up pools, caches and allocators
            fds0, rss0 = _fds(), _rss_kib()
            t = time.perf_counter()
            await batch(1000)
            took = time.perf_counter() - t
            fds1, rss1 = _fds(), _rss_kib()
            assert not proxy.active
    print(f"1000 requests in {took:.2f} s; fds {fds0}->{fds1}; RSS {rss0}->{rss1} KiB")
    assert fds1 - fds0 <= 4
    assert rss1 - rss0 < 8 * 1024


async def test_graceful_shutdown_lets_streams_finish_within_grace() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c", "d"]), headers=SSE, gap_s=0.05)
        cfg = load_config(env={}, overrides={"upstream": up.url, "listen": "127.0.0.1:0"})
        bus = EventBus()
        proxy = ProxyServer(cfg, bus)
        url = await proxy.start()
        async with aiohttp.ClientSession() as s:
            r = await s.post(url + CHAT, json={"model": "m", "stream": True,
                                                "stream_options": {"include_usage": True}})
            await r.content.readany()
            reader = asyncio.create_task(r.read())
            summary = await proxy.shutdown(grace_s=5.0)
            body = await reader
            assert body.endswith(b"data: [DONE]\n\n")
            # no longer accepting
            with pytest.raises(aiohttp.ClientConnectionError):
                async with s.get(url + "/v1/models") as r2:
                    await r2.read()
    assert summary.finished_in_grace == 1 and summary.cancelled == 0
    bus.drain()
    assert bus.delivered == 1


async def test_shutdown_cancels_streams_after_the_grace() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c"]), headers=SSE, gap_s=0.01,
                           hang_after=2)
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            r = await s.post(url + CHAT, json={"model": "m", "stream": True,
                                                "stream_options": {"include_usage": True}})
            await r.content.readany()
            t = time.perf_counter()
            summary = await proxy.shutdown(grace_s=0.2)
            took = time.perf_counter() - t
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
            (rec,) = await recs.wait(1)
            await up.wait_disconnect()
    assert summary.cancelled == 1 and summary.finished_in_grace == 0
    assert 0.2 <= took < 3.0
    assert rec.outcome == "cancelled" and rec.error == "proxy shut down"
    assert up.disconnects


async def test_start_reports_the_bound_port_and_refuses_without_upstream() -> None:
    async with scripted_upstream() as up, running_proxy(up.url) as (_, url, _recs):
        host, port = url.removeprefix("http://").split(":")
        assert host == "127.0.0.1" and int(port) > 0
    with pytest.raises(ConfigError):
        await ProxyServer(load_config(env={}), EventBus()).start()


async def test_reuse_port_lets_two_proxies_share_an_address() -> None:
    async with scripted_upstream() as up:
        cfg = load_config(env={}, overrides={"upstream": up.url, "listen": "127.0.0.1:0"})
        a = ProxyServer(cfg, EventBus())
        url = await a.start(reuse_port=True)
        cfg2 = load_config(env={}, overrides={"upstream": up.url,
                                              "listen": url.removeprefix("http://")})
        b = ProxyServer(cfg2, EventBus())
        try:
            assert await b.start(reuse_port=True) == url
        finally:
            await b.shutdown(0)
            await a.shutdown(0)
