"""One-process llmtop runs its observers (aggregation, detectors, recording, the admin API)
on an event loop of their own in a second thread: the proxy's loop only forwards.

These tests stall one side and show the other carries on: the admin API answers while
the proxy's loop is blocked, and streams flow while the observers are stuck."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import urllib.request
from collections.abc import Sequence
from typing import Any

import aiohttp

from llmtop.config import load_config
from llmtop.events import Event, RequestRecord
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

BODY = {"model": "sim-tiny", "stream": True, "max_tokens": 6,
        "messages": [{"role": "user", "content": "hello"}]}


def _server(upstream: str) -> LlmtopServer:
    cfg = load_config(None, env={}, overrides={
        "upstream": upstream, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0"})
    return LlmtopServer(cfg, out=io.StringIO())


async def _stream(session: aiohttp.ClientSession, url: str) -> bytes:
    async with session.post(url + "/v1/chat/completions", json=BODY) as r:
        assert r.status == 200
        return await r.read()


async def test_the_admin_api_answers_while_the_proxy_loop_is_blocked() -> None:
    async with running_sim("tiny", time_scale=0.05) as sim:
        server = _server(sim.url)
        await server.start()
        try:
            async with aiohttp.ClientSession() as s:
                await _stream(s, server.proxy_url)
                for _ in range(200):  # the record is published once the relay has settled
                    async with s.get(server.admin_url + "/llmtop/v1/health") as r:
                        if (await r.json())["requests"] == 1:
                            break
                    await asyncio.sleep(0.05)
            answers: list[tuple[int, dict[str, Any]]] = []
            done = threading.Event()

            def ask() -> None:
                for path in ("/llmtop/v1/health", "/llmtop/v1/snapshot?window=10"):
                    with urllib.request.urlopen(server.admin_url + path, timeout=10) as r:
                        answers.append((r.status, json.loads(r.read())))
                done.set()

            threading.Thread(target=ask, daemon=True).start()
            # block this (the proxy's) event loop outright until the thread has its answers
            answered_while_blocked = done.wait(15)
        finally:
            await server.stop(1.0)
    assert answered_while_blocked
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][1]["status"] == "ok"
    assert answers[1][1]["system"]["requests"] == 1  # the stream before the block


async def test_streams_flow_while_the_observers_are_stuck() -> None:
    async with running_sim("tiny", time_scale=0.05) as sim:
        server = _server(sim.url)
        release = threading.Event()
        stuck_in: list[str] = []
        seen: list[str] = []

        def stuck(batch: Sequence[Event]) -> None:
            stuck_in.append(threading.current_thread().name)
            release.wait(30)  # the observers' thread is stuck here
            seen.extend(e.id for e in batch if isinstance(e, RequestRecord))

        server.bus.subscribe(stuck)
        await server.start()
        try:
            async with aiohttp.ClientSession() as s:
                await _stream(s, server.proxy_url)
                for _ in range(200):  # until the first record has reached the stuck observer
                    if stuck_in:
                        break
                    await asyncio.sleep(0.05)
                assert stuck_in
                bodies = await asyncio.wait_for(
                    asyncio.gather(*(_stream(s, server.proxy_url) for _ in range(5))), 20)
                queued = server.bus.pending()
                release.set()
                for _ in range(200):
                    if len(seen) == 6:
                        break
                    await asyncio.sleep(0.05)
        finally:
            release.set()
            summary = await server.stop(1.0)
    assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
    assert stuck_in[0] != threading.main_thread().name
    assert queued >= 1  # the records waited in the bus, not in front of the streams
    assert len(seen) == 6 and summary.requests == 6


async def test_stop_ends_the_observers_thread() -> None:
    before = set(threading.enumerate())  # Thread objects: idents of ended threads are reused
    async with running_sim("tiny", time_scale=0.05) as sim:
        server = _server(sim.url)
        await server.start()
        started = [t for t in threading.enumerate() if t not in before]
        assert any(t.name == "llmtop-observers" for t in started)
        await server.stop(1.0)  # joins the thread
    assert not any(t.name == "llmtop-observers" for t in threading.enumerate())
