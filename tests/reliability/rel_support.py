"""Shared pieces for the reliability tests: a hostile upstream written on raw asyncio
sockets (so it can do what no well-behaved HTTP server does: reset, lie about lengths,
never answer), an in-process proxy with its records, raw-socket client helpers, and a
``llmtop run --headless`` subprocess whose /proc can be read.

Imported by the test_rel_* modules (pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llmtop.bus import EventBus
from llmtop.config import load_config
from llmtop.events import Event, RequestRecord
from llmtop.proxy.server import ProxyServer

CHAT = "/v1/chat/completions"
FAULT = "X-Fault"
"""Request header that picks the hostile upstream's behaviour (forwarded by the proxy)."""


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(text: str) -> bytes:
    return sse({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


NORMAL_STREAM: tuple[bytes, ...] = (
    chat_chunk("Hello"), chat_chunk(" world"), b"data: [DONE]\n\n")


# -- the hostile upstream -----------------------------------------------------------------


@dataclass
class UpReq:
    """One request as the hostile upstream read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Conn:
    """The upstream side of one proxy→upstream connection, handed to a behaviour."""

    def __init__(self, up: HostileUpstream, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.up = up
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self, status: int = 200, headers: Sequence[tuple[str, str]] = (),
                   *, chunked: bool = True, reason: str = "X") -> None:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def chunk(self, data: bytes) -> None:
        await self.send(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        await self.send(b"0\r\n\r\n")

    async def hold(self) -> None:
        """Say nothing until the proxy closes the connection; note when it did."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        self.up.note_closed()

    def reset(self) -> None:
        """Abort with a TCP RST (SO_LINGER 0), as a crashing engine would."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Behaviour = Callable[[Conn, UpReq], Awaitable[bool]]
"""Answers one request; returns True to keep the connection for another request."""


async def normal(conn: Conn, req: UpReq) -> bool:
    """A well-behaved OpenAI-style SSE stream (or JSON for non-chat paths)."""
    if req.path.startswith(CHAT):
        await conn.head(200, [("Content-Type", "text/event-stream")])
        for c in NORMAL_STREAM:
            await conn.chunk(c)
        await conn.end()
    else:
        body = b'{"ok":true}'
        await conn.head(200, [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))], chunked=False)
        await conn.send(body)
    return True


class HostileUpstream:
    """An HTTP/1.1 upstream on raw asyncio sockets. The behaviour for a request is
    ``behaviours[request.headers["X-Fault"]]`` (``normal`` without the header).

    ``closed`` lists (perf_counter) times at which a behaviour that was holding or
    writing saw the proxy close its connection.
    """

    def __init__(self, behaviours: dict[str, Behaviour] | None = None) -> None:
        self.behaviours: dict[str, Behaviour] = dict(behaviours or {})
        self.requests: list[UpReq] = []
        self.received = asyncio.Event()
        self.closed: list[float] = []
        self.closed_event = asyncio.Event()
        self._changed = asyncio.Event()
        self.connections = 0
        self.url = ""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def note_closed(self) -> None:
        self.closed.append(time.perf_counter())
        self.closed_event.set()
        self._changed.set()

    async def wait_closed_count(self, n: int, within_s: float = 3.0) -> None:
        """Wait until ``n`` connections have been seen closing."""
        async with asyncio.timeout(within_s):
            while len(self.closed) < n:
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, within_s: float = 2.0) -> float:
        async with asyncio.timeout(within_s):
            await self.closed_event.wait()
        return self.closed[0]

    async def start(self, port: int = 0) -> str:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", port,
                                                  limit=1 << 24)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()  # every behaviour's read or write then ends
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        self._writers.add(writer)
        conn = Conn(self, reader, writer)
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    return
                self.requests.append(req)
                self.received.set()
                behaviour = self.behaviours.get(req.headers.get(FAULT.lower(), ""), normal)
                if not await behaviour(conn, req):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):  # the peer left mid-request (or sent something unparsable)
            self.note_closed()
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()


async def _read_request(reader: asyncio.StreamReader) -> UpReq | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    return UpReq(method, path, headers, body)


@contextlib.asynccontextmanager
async def hostile_upstream(behaviours: dict[str, Behaviour] | None = None,
                           port: int = 0) -> AsyncIterator[HostileUpstream]:
    up = HostileUpstream(behaviours)
    await up.start(port)
    try:
        yield up
    finally:
        await up.close()


# -- the proxy, in process ----------------------------------------------------------------


class Records:
    """What the proxy publishes on its bus."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.items: list[RequestRecord] = []
        bus.subscribe(self._take)

    def _take(self, events: Sequence[Event]) -> None:
        self.items.extend(e for e in events if isinstance(e, RequestRecord))

    async def wait(self, n: int = 1, within_s: float = 5.0) -> list[RequestRecord]:
        deadline = time.monotonic() + within_s
        while True:
            self.bus.drain()
            if len(self.items) >= n:
                return self.items
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {n} records, got {len(self.items)}")
            await asyncio.sleep(0.005)


@dataclass
class Proxy:
    server: ProxyServer
    url: str
    records: Records
    host: str = "127.0.0.1"
    port: int = 0
    checks: int = 0

    async def assert_healthy(self, *, idle: bool = True) -> RequestRecord:
        """A normal streaming request still goes through, byte for byte, recorded ok;
        with ``idle``, nothing is left in flight afterwards."""
        self.checks += 1
        user = f"health-check-{self.checks}"
        async with aiohttp.ClientSession() as s, s.post(
                self.url + CHAT, json={"model": "m", "stream": True},
                headers={"X-LLMTOP-User": user},
                timeout=aiohttp.ClientTimeout(total=10)) as r:
            assert r.status == 200
            body = await r.read()
        assert body == b"".join(NORMAL_STREAM)
        deadline = time.monotonic() + 5
        while True:
            self.records.bus.drain()
            mine = [r for r in self.records.items if r.user == user]
            if mine or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.005)
        (rec,) = mine
        assert rec.outcome == "ok" and rec.status == 200 and rec.completion_tokens == 2, rec
        if idle:
            assert not self.server.active, self.server.active
        return rec


@contextlib.asynccontextmanager
async def running_proxy(upstream: str, **overrides: Any) -> AsyncIterator[Proxy]:
    """A ProxyServer in front of ``upstream``; overrides are dotted keys with ``__``
    for dots (``timeouts__idle_s=0.5``)."""
    keys = {k.replace("__", "."): v for k, v in overrides.items()}
    cfg = load_config(env={}, overrides={"upstream": upstream, "listen": "127.0.0.1:0",
                                         "inject_usage": False, **keys})
    bus = EventBus()
    records = Records(bus)
    server = ProxyServer(cfg, bus)
    url = await server.start()
    port = int(url.rsplit(":", 1)[1])
    try:
        yield Proxy(server, url, records, port=port)
    finally:
        await server.shutdown(1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def raw_exchange(port: int, data: bytes, *, read_s: float = 3.0) -> bytes:
    """Send raw bytes to 127.0.0.1:port and return everything read until the peer
    closes (or ``read_s`` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        out = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(read_s):
                while chunk := await reader.read(65536):
                    out += chunk
        return out
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


# -- llmtop run --headless as a subprocess -------------------------------------------------

_LINE = re.compile(r"llmtop: (proxy|admin) listening on (\S+)")


@dataclass
class LlmtopProcess:
    """``python -m llmtop run --headless`` with its stdout/stderr in files."""

    proc: subprocess.Popen[bytes]
    proxy_url: str
    admin_url: str
    out_path: Path
    err_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def output(self) -> str:
        return (self.out_path.read_bytes() + self.err_path.read_bytes()).decode(
            "utf-8", "replace")

    def terminate(self, sig: int = signal.SIGTERM, within_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(within_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_llmtop(tmp: Path, upstream: str, *args: str, env: dict[str, str] | None = None,
                 name: str = "llmtop", within_s: float = 30.0) -> LlmtopProcess:
    """Start ``llmtop run --headless`` on free loopback ports and wait for both
    "listening on" lines; raises with the process output if it exits first."""
    out_path, err_path = tmp / f"{name}.out", tmp / f"{name}.err"
    full_env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "LLMTOP_ENGINE_ENABLED": "false",
                "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
           "--listen", "127.0.0.1:0", *args]
    if "--admin" not in args:
        cmd += ["--admin", "127.0.0.1:0"]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env)
    deadline = time.monotonic() + within_s
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        for m in _LINE.finditer(out_path.read_text(errors="replace")):
            found[m.group(1)] = m.group(2)
        if len(found) == 2:
            return LlmtopProcess(proc, found["proxy"], found["admin"], out_path, err_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    raise AssertionError(
        f"llmtop run did not start (rc={proc.returncode}): "
        f"{out_path.read_text(errors='replace')}{err_path.read_text(errors='replace')}")


@contextlib.contextmanager
def llmtop_process(tmp: Path, upstream: str, *args: str, **kw: Any) -> Iterator[LlmtopProcess]:
    p = start_llmtop(tmp, upstream, *args, **kw)
    try:
        yield p
    finally:
        p.kill()


class ThreadedUpstream:
    """A :class:`HostileUpstream` on its own event loop in a daemon thread, for tests
    that drive a subprocess proxy synchronously (or from another loop)."""

    def __init__(self, behaviours: dict[str, Behaviour] | None = None) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.up = HostileUpstream(behaviours)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.up.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.up.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
