"""The test client's clock, read where the bytes arrive — inside the openai SDK's own HTTP
stack (httpx2 over httpcore2), not after the SDK has parsed them.

The SDK hands a chunk to its caller only after decoding SSE, parsing JSON and building a
pydantic object, and it reads the socket only when its caller asks for the next chunk: a
clock read there counts the client's own work (and, for the end of the body, the handling
of the last chunks) as if it were latency. So :class:`TimedTransport` — httpx2's own
transport on an httpcore2 connection pool whose network backend is :class:`WireBackend` —
notes:

* ``t_send``: when httpcore2 starts writing the request head (its ``trace`` hook);
* for each piece of the body: when the bytes that completed it came off the socket — the
  event loop's ``data_received``, whether or not the SDK was reading at that moment (each
  ``read`` hands httpcore2 exactly one arrival, so every byte has one arrival time);
* ``t_end``: when the bytes that ended the body (the chunked terminator) arrived.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore2
import httpx2


class _WireProtocol(asyncio.Protocol):
    """Keeps each arrival separate, with the time the event loop received it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.arrivals: deque[tuple[float, bytes]] = deque()
        self.eof = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.arrivals.append((time.time(), data))
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class WireStream(httpcore2.AsyncNetworkStream):
    """One TCP connection; :attr:`last_arrival` is when the bytes of the latest ``read``
    came in."""

    def __init__(self, protocol: _WireProtocol) -> None:
        self._p = protocol
        self.last_arrival = 0.0

    # the ``timeout`` parameters below are httpcore2's interface (ASYNC109 would have us drop them)
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        p = self._p
        if not p.arrivals and not p.eof:
            try:
                async with asyncio.timeout(timeout):
                    await p.wait()
            except TimeoutError as exc:
                raise httpcore2.ReadTimeout(str(exc)) from exc
        if not p.arrivals:
            if p.error is not None:
                raise httpcore2.ReadError(str(p.error))
            return b""
        at, data = p.arrivals.popleft()
        if len(data) > max_bytes:
            p.arrivals.appendleft((at, data[max_bytes:]))
            data = data[:max_bytes]
        self.last_arrival = at
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        t = self._p.transport
        if t is None or t.is_closing():
            raise httpcore2.WriteError("connection closed")
        t.write(buffer)  # small request bodies only: no flow control needed

    async def aclose(self) -> None:
        if self._p.transport is not None:
            self._p.transport.close()

    async def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.UnsupportedProtocol("the end-to-end tests use plain HTTP on loopback")

    def get_extra_info(self, info: str) -> Any:
        t = self._p.transport
        if info == "is_readable":  # an idle keep-alive connection the server closed
            return bool(self._p.arrivals) or self._p.eof
        if t is None:
            return None
        if info == "socket":
            return t.get_extra_info("socket")
        if info == "client_addr":
            return t.get_extra_info("sockname")
        if info == "server_addr":
            return t.get_extra_info("peername")
        return None


class WireBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend on a plain asyncio protocol (TCP_NODELAY, as anyio's)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        protocol = _WireProtocol()
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: protocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                ),
                timeout,
            )
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        assert protocol.transport is not None
        sock = protocol.transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in socket_options or ():
            sock.setsockopt(*option)
        return WireStream(protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.UnsupportedProtocol("the end-to-end tests use TCP on loopback")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class WireLog:
    """One request as the client's HTTP layer saw it (wall-clock times, ``time.time()``)."""

    __slots__ = ("parts", "t_end", "t_send")

    def __init__(self) -> None:
        self.t_send: float | None = None
        """When httpcore2 began writing the request head."""
        self.parts: list[tuple[float, bytes]] = []
        """The response body, piece by piece, each with when its last byte arrived."""
        self.t_end: float | None = None
        """When the end of the response body arrived."""


class _TimedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, wire: WireStream, log: WireLog) -> None:
        self._inner = inner
        self._wire = wire
        self._log = log

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parts, wire = self._log.parts, self._wire
        async for part in self._inner:
            parts.append((wire.last_arrival, part))
            yield part
        self._log.t_end = wire.last_arrival

    async def aclose(self) -> None:
        await self._inner.aclose()


class TimedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport, its connections on :class:`WireBackend`; what it sees of each
    request that carries the ``user_header`` goes into ``logs[<that header's value>]``."""

    def __init__(self, user_header: str, logs: dict[str, WireLog]) -> None:
        super().__init__()
        # the pool httpx2 would build with the openai SDK's limits (1000 connections, 100
        # kept alive), on our network backend (httpx2 has no parameter for that)
        self._pool = httpcore2.AsyncConnectionPool(
            max_connections=1000,
            max_keepalive_connections=100,
            keepalive_expiry=5.0,
            network_backend=WireBackend(),
        )
        self._user_header = user_header
        self._logs = logs

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        user = request.headers.get(self._user_header)
        if not user:
            return await super().handle_async_request(request)
        log = self._logs[user] = WireLog()

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name == "http11.send_request_headers.started":
                log.t_send = time.time()

        request.extensions = {**request.extensions, "trace": trace}
        response = await super().handle_async_request(request)
        wire = response.extensions.get("network_stream")
        assert isinstance(wire, WireStream), f"not our network stream: {wire!r}"
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _TimedBody(response.stream, wire, log)
        return response


_EVENT_END = re.compile(rb"(?:\r\n|\r|\n)(?:\r\n|\r|\n)")


def content_text(obj: dict[str, Any]) -> str:
    """The output text of one OpenAI chat or legacy-completions stream event."""
    return "".join(
        (c.get("delta") or {}).get("content") or c.get("text") or ""
        for c in obj.get("choices") or []
    )


def wire_content_events(parts: list[tuple[float, bytes]]) -> list[tuple[float, str]]:
    """(arrival time, text) of each content-carrying SSE event in a body that came as
    ``parts``: an event counts when the bytes that completed it (its blank line) arrived —
    the moment a client could first act on it. Independent of llmtop's parsers and of the
    SDK's."""
    body = b"".join(part for _, part in parts)
    ends: list[int] = []
    total = 0
    for _, part in parts:
        total += len(part)
        ends.append(total)
    out: list[tuple[float, str]] = []
    pos = 0
    for m in _EVENT_END.finditer(body):
        event, pos = body[pos : m.start()], m.end()
        data = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
        if not data or data == [b"[DONE]"]:
            continue
        text = content_text(json.loads(b"\n".join(data)))
        if text:
            out.append((parts[bisect.bisect_left(ends, m.end())][0], text))
    return out
