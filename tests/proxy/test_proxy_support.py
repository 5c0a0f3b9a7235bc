"""Shared pieces for the proxy tests: a scripted upstream and a running proxy, both real
aiohttp servers on 127.0.0.1 port 0. (Imported by the test_relay_*/test_proxy_* modules;
the one test here checks the scripted upstream itself.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from llmtop.bus import EventBus
from llmtop.config import load_config
from llmtop.events import Event, RequestRecord
from llmtop.proxy.server import ProxyServer


@dataclass
class Script:
    """What the scripted upstream answers: ``chunks`` written one by one, ``gap_s`` apart
    (each write is one HTTP chunk, flushed), or as one body with Content-Length."""

    chunks: Sequence[bytes] = (b'{"ok": true}',)
    status: int = 200
    headers: Mapping[str, str] = field(
        default_factory=lambda: {"Content-Type": "application/json"})
    gap_s: float = 0.0
    first_delay_s: float = 0.0
    content_length: bool = False
    """Send the joined chunks as one body with Content-Length."""
    hang_after: int | None = None
    """Stop writing (but keep the connection open) after this many chunks."""
    break_after: int | None = None
    """Drop the connection (no end of body) after this many chunks."""


@dataclass
class Seen:
    """One request as the upstream received it."""

    method: str
    path_qs: str
    headers: list[tuple[str, str]]
    body: bytes
    t_recv: float


class ScriptedUpstream:
    """An upstream that answers every request with ``script_for(request)`` and remembers
    what it received, what it sent (in write order), and whether the client left early."""

    def __init__(self) -> None:
        self.script = Script()
        self.by_path: dict[str, Script] = {}
        self.seen: list[Seen] = []
        self.sent: list[list[bytes]] = []
        self.send_times: list[list[float]] = []
        self.disconnects: list[float] = []
        self.disconnected = asyncio.Event()
        self.received = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self.responder: Callable[[Seen], Script] | None = None

    def script_for(self, seen: Seen) -> Script:
        if self.responder is not None:
            return self.responder(seen)
        return self.by_path.get(seen.path_qs.split("?", 1)[0], self.script)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = Seen(request.method, request.raw_path, list(request.headers.items()), body,
                    time.perf_counter())
        self.seen.append(seen)
        self.received.set()
        sc = self.script_for(seen)
        sent: list[bytes] = []
        times: list[float] = []
        self.sent.append(sent)
        self.send_times.append(times)
        try:
            if sc.first_delay_s:
                await asyncio.sleep(sc.first_delay_s)
            if sc.content_length:
                data = b"".join(sc.chunks)
                sent.append(data)
                times.append(time.perf_counter())
                return web.Response(status=sc.status, body=data, headers=sc.headers)
            resp = web.StreamResponse(status=sc.status, headers=sc.headers)
            await resp.prepare(request)
            for i, chunk in enumerate(sc.chunks):
                if sc.hang_after is not None and i >= sc.hang_after:
                    await asyncio.sleep(3600)
                if sc.break_after is not None and i >= sc.break_after:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if sc.gap_s and i:
                    await asyncio.sleep(sc.gap_s)
                await resp.write(chunk)
                sent.append(chunk)
                times.append(time.perf_counter())
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.disconnects.append(time.perf_counter())
            self.disconnected.set()
            raise
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def wait_disconnect(self, within_s: float = 2.0) -> float:
        """When the upstream saw its client (the proxy) leave (perf_counter seconds)."""
        async with asyncio.timeout(within_s):
            await self.disconnected.wait()
        return self.disconnects[0]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Records:
    """Collects what the proxy publishes on its bus."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.items: list[RequestRecord] = []
        bus.subscribe(self._take)

    def _take(self, events: Sequence[Event]) -> None:
        self.items.extend(e for e in events if isinstance(e, RequestRecord))

    async def wait(self, n: int = 1, within_s: float = 5.0) -> list[RequestRecord]:
        """Wait until at least ``n`` records have been published; returns them all."""
        deadline = time.monotonic() + within_s
        while True:
            self.bus.drain()
            if len(self.items) >= n:
                return self.items
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {n} records, got {len(self.items)}")
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def scripted_upstream() -> AsyncIterator[ScriptedUpstream]:
    up = ScriptedUpstream()
    await up.start()
    try:
        yield up
    finally:
        await up.close()


@contextlib.asynccontextmanager
async def running_proxy(
    upstream: str, **overrides: Any
) -> AsyncIterator[tuple[ProxyServer, str, Records]]:
    """A ProxyServer in front of ``upstream``; overrides are dotted config keys with
    ``__`` for dots (``timeouts__idle_s=1``)."""
    keys = {k.replace("__", "."): v for k, v in overrides.items()}
    cfg = load_config(env={}, overrides={"upstream": upstream, "listen": "127.0.0.1:0", **keys})
    bus = EventBus()
    records = Records(bus)
    proxy = ProxyServer(cfg, bus)
    url = await proxy.start()
    try:
        yield proxy, url, records
    finally:
        await proxy.shutdown(1.0)


def dechunk(wire: bytes) -> bytes:
    """The payload of a chunked body as it came off the wire (up to its last chunk)."""
    out, pos = b"", 0
    while True:
        nl = wire.index(b"\r\n", pos)
        size = int(wire[pos:nl], 16)
        if size == 0:
            return out
        out += wire[nl + 2:nl + 2 + size]
        pos = nl + 4 + size


def sha(parts: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(parts)).hexdigest()


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def openai_chunks(texts: Sequence[str], *, usage: dict[str, int] | None = None,
                  model: str = "m1") -> list[bytes]:
    """An OpenAI chat stream: role-only first chunk, one chunk per text, finish chunk,
    optional usage-only chunk, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    out = [sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})]
    for t in texts:
        out.append(sse({**base, "choices": [{"index": 0, "delta": {"content": t},
                                             "finish_reason": None}]}))
    out.append(sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if usage is not None:
        out.append(sse({**base, "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    return out


async def read_chunks(resp: aiohttp.ClientResponse) -> list[bytes]:
    """Every read the client got, as it got them."""
    return [data async for data in resp.content.iter_any()]


async def test_scripted_upstream_sends_its_chunks_in_order() -> None:
    async with scripted_upstream() as up, aiohttp.ClientSession() as s:
        up.script = Script(chunks=[b"a", b"bb", b"ccc"], gap_s=0.02,
                           headers={"Content-Type": "text/plain"})
        async with s.post(up.url + "/x?q=1", data=b"hi") as r:
            got = await read_chunks(r)
        assert got == [b"a", b"bb", b"ccc"]
        assert up.seen[0].path_qs == "/x?q=1" and up.seen[0].body == b"hi"
        assert up.sent[0] == [b"a", b"bb", b"ccc"]
