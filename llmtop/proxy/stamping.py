"""t0 as ``shared/docs/domain.md`` defines it: when the request line and headers were read.

aiohttp parses a request in the protocol's ``data_received`` (the moment its bytes came off
the socket) but calls the handler a couple of event-loop turns later, from the
connection's task. Under load those turns take milliseconds, and a t0 taken at the start
of the handler would leave that queueing out of TTFT — a pitfall the domain page names.
So the proxy's server protocol notes ``time.perf_counter_ns()`` in ``data_received`` for
every request whose headers that read completed, and the request factory hands the note
to the request (:attr:`StampedRequest.t0_ns`). Stamps and requests pair up in order because
aiohttp hands every parsed message — errors too — through the factory, first in first out.

This leans on one private attribute of aiohttp's ``RequestHandler`` (``_messages``, the
queue of parsed requests). Where it is missing, :func:`t0_ns_of` falls back to the time
the handler started, which is what a plain aiohttp handler would see.

Requests served directly: aiohttp's parse, its request objects, its handler task and those
loop turns cost a plain request about as much as the rest of the proxy's work on it. So
when one read holds exactly one plain request (:func:`llmtop.proxy.quickhead.read_request`)
on a connection with nothing else open, the server's ``direct_start`` hook is offered it
first thing in ``data_received``; when it takes it (a pooled upstream connection is idle),
the proxy serves it from callbacks (:class:`llmtop.proxy.direct.DirectExchange`) and
aiohttp never sees those bytes. Reads that arrive while it is open are held and handed on,
in order, once its response has ended (``direct_done``); a connection that closes first
tells it (``client_lost``).

Only while aiohttp's parser is at a message boundary may a read bypass it: after every
read aiohttp parsed, the connection stays *aligned* only when that read was exactly one
plain request and aiohttp read it the same way (else the parser may hold part of a
message, and every later read must go to it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader

from llmtop.proxy.errors import error_response
from llmtop.proxy.quickhead import QuickRequest, asks_close, read_request


class Direct(Protocol):
    """A request served without aiohttp (see the module docstring)."""

    def client_lost(self) -> None:
        """The client's connection closed before the response ended."""


DirectHook = Callable[[QuickRequest, "StampingRequestHandler", int], Direct | None]
"""``(request, protocol, t0_ns)`` → the request being served, or None to leave it to
aiohttp."""

_HOLD_MAX = 1 << 16
"""Bytes held behind a direct request before reading from the client pauses."""


class StampingRequestHandler(web.RequestHandler):
    """aiohttp's server protocol, noting when each request's headers were read — and
    closing a connection that sends no complete request head for ``head_timeout_s``
    (after it opens, and after each response): aiohttp's server has no header timeout,
    so a client sending half a request head would hold its connection for ever."""

    __slots__ = ("_aligned", "_head_since", "_head_timer", "_held", "_held_bytes",
                 "_held_paused", "direct", "direct_start", "head_timeout_s", "open_requests",
                 "rx_stamps")

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.rx_stamps: deque[int] = deque()
        self.head_timeout_s: float | None = None
        self.direct_start: DirectHook | None = None
        self.direct: Direct | None = None
        """The request being served directly, until its response has ended."""
        self._held: list[tuple[int, bytes]] = []
        """Reads (with their arrival times) that came while ``direct`` was open."""
        self._held_bytes = 0
        self._held_paused = False
        self._aligned = True
        """aiohttp's parser holds no part of a message (see the module docstring)."""
        self.open_requests = 0
        """Requests handed to a handler whose response is not written in full yet."""
        self._head_since: float | None = None  # loop time since a head is awaited
        self._head_timer: asyncio.TimerHandle | None = None

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        """aiohttp's answer to a malformed request (400, naming the fault) or to a bug of
        ours (500) as a JSON error in the OpenAI shape, like the proxy's other errors (QA: a
        bad method, bad chunked body or Content-Length with Transfer-Encoding got
        ``text/plain`` that a client's JSON error handling could not read)."""
        super().handle_error(request, status, exc, message)  # its logging and checks
        if status < 500:
            text = " ".join(str(message or exc or "").split())[:300] or "malformed request"
            resp = error_response("other", status, f"bad request: {text}", "bad_request")
        else:
            resp = error_response("other", status, "llmtop internal error", "internal_error")
        resp.force_close()
        return resp

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        self._held.clear()
        direct, self.direct = self.direct, None
        if direct is not None:
            direct.client_lost()

    def data_received(self, data: bytes) -> None:
        self._received(data, perf_counter_ns())

    def _received(self, data: bytes, now: int) -> None:
        if self.direct is not None:  # after the open response, in order
            self._hold(now, data)
            return
        queue = getattr(self, "_messages", None)
        if queue is None:
            super().data_received(data)
            return
        quick = read_request(data)
        if quick is not None and self._aligned:
            start = self.direct_start
            # nothing else open on this connection (pipelined requests keep their order)
            if (start is not None and not queue
                    and not self.open_requests and not getattr(self, "_close", True)
                    and not getattr(self, "_force_close", True)):
                try:
                    direct = start(quick, self, now)
                except Exception:  # never at the cost of the connection: aiohttp's way
                    direct = None
                if direct is not None:
                    self.direct = direct
                    self._head_since = None
                    return
        before, aligned = len(queue), self._aligned
        super().data_received(data)
        added = len(queue) - before
        if added > 0:
            self._head_since = None
            for i in range(len(queue) - added, len(queue)):
                self.rx_stamps.append(now)
                message, payload = queue[i]
                if (isinstance(message, RawRequestMessage) and message.version == (1, 0)
                        and not message.should_close
                        and asks_close(message.headers.getall("Connection", ()))):
                    # aiohttp's C parser (llhttp) keeps an HTTP/1.0 connection whenever
                    # keep-alive is among its Connection tokens, close or not; close wins
                    # (RFC 9112 9.3, 9.6), as the direct path reads it (read_request)
                    queue[i] = (message._replace(should_close=True), payload)
            message, payload = queue[-1]
            if (isinstance(message, RawRequestMessage) and message.upgrade
                    and not getattr(self, "_upgraded", True)
                    and _bytes_after(data, message, aligned and added == 1)):
                # an Upgrade that aiohttp's parser declines (h2c; it takes only
                # websocket): the parser drops whatever followed that request in the read
                # (desync checks: a request pipelined behind an h2c offer was never
                # answered, and the client would read the answer to its next request as
                # the answer to that one). So the connection closes after this response,
                # and the client sends again what went unanswered, as HTTP/1.1 clients do
                queue[-1] = (message._replace(should_close=True), payload)
        if quick is None:
            self._aligned = False
        else:
            message, payload = queue[-1] if added == 1 else (None, None)
            self._aligned = (
                isinstance(message, RawRequestMessage) and payload is not None
                and payload.is_eof() and message.method == quick.method
                and message.path == quick.target and message.version == quick.version
                and not message.upgrade)

    def _hold(self, now: int, data: bytes) -> None:
        self._held.append((now, data))
        self._held_bytes += len(data)
        if self._held_bytes > _HOLD_MAX and not self._held_paused and self.transport:
            self._held_paused = True
            self.transport.pause_reading()

    def direct_done(self, direct: Direct, keep_alive: bool) -> None:
        """``direct``'s response has ended: close the connection, or carry on with what
        the client sent meanwhile."""
        if self.direct is not direct:
            return
        self.direct = None
        transport = self.transport
        if transport is None:
            return
        if not keep_alive or getattr(self, "_close", True) or getattr(
                self, "_force_close", True):
            self._held.clear()
            transport.close()
            return
        self._keepalive_from_now()  # as aiohttp does at the end of each response
        if self._held_paused:
            self._held_paused = False
            transport.resume_reading()
        self._await_head()  # what was held may be only part of a head: it is due now
        held = self._held
        if held:  # (else the empty list stays: one object less to collect per request)
            self._held, self._held_bytes = [], 0
            for now, data in held:
                if self.transport is None:
                    break
                self._received(data, now)

    def _process_keepalive(self) -> None:
        # aiohttp closes a connection whose handler has waited for a request for its
        # keep-alive time: while a direct request streams, its handler waits all along
        if self.direct is not None:
            self._keepalive_handle = self._loop.call_at(
                self._keepalive_from_now(), self._process_keepalive)
            return
        super()._process_keepalive()

    def _keepalive_from_now(self) -> float:
        """Restart aiohttp's keep-alive clock; returns when it runs out (loop time)."""
        close_time = self._loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        return close_time

    def resume_reading(self, resume_parser: bool = True) -> None:
        # aiohttp's StreamReader calls this after every read of a request body, paused or
        # not; with nothing paused it would re-enter data_received(b"") and resume the
        # transport for nothing (a dozen calls a request)
        if getattr(self, "_reading_paused", True) or getattr(self, "_buffer_paused", True):
            super().resume_reading(resume_parser)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            out = await super().finish_response(request, resp, start_time)
        finally:
            self.request_done(request)
        if not getattr(self, "_messages", None):
            self._await_head()
        return out

    def request_done(self, request: object) -> None:
        """``request``'s response is written in full (by the relay as its last byte goes
        out, or when aiohttp finishes it, whichever comes first): the next request on this
        connection may be served directly."""
        if isinstance(request, StampedRequest) and request.open:
            request.open = False
            self.open_requests = max(0, self.open_requests - 1)

    def _await_head(self) -> None:
        """From now on a complete request head is due within ``head_timeout_s``. One timer
        per connection, re-armed lazily when it fires early."""
        limit = self.head_timeout_s
        if limit is None:
            return
        loop = self._loop  # (asyncio.get_running_loop() is a getpid() syscall on 3.11)
        self._head_since = loop.time()
        if self._head_timer is None:
            self._head_timer = loop.call_later(limit, self._check_head)

    def _check_head(self) -> None:
        self._head_timer = None
        since, limit = self._head_since, self.head_timeout_s
        if since is None or limit is None:
            return
        loop = self._loop
        left = since + limit - loop.time()
        if left > 0:
            self._head_timer = loop.call_later(left, self._check_head)
        elif self.transport is not None:
            self.transport.close()


def _bytes_after(data: bytes, message: RawRequestMessage, whole: bool) -> bool:
    """Whether ``data``, the read that completed ``message``, may hold bytes after it;
    ``whole``: the read began with ``message`` and held no other (else, or with a chunked
    body, it may, as far as this can tell)."""
    if not whole or message.chunked:
        return True
    end = data.find(b"\r\n\r\n")
    length = message.headers.get("Content-Length", "0")
    return end < 0 or not length.isdigit() or len(data) > end + 4 + int(length)


class StampingServer(web.Server):
    """``web.Server`` whose connections are :class:`StampingRequestHandler`."""

    def __init__(self, *args: Any, head_timeout_s: float | None = None,
                 direct_start: DirectHook | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.direct_start = direct_start

    def __call__(self) -> web.RequestHandler:
        handler = StampingRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.head_timeout_s
        handler.direct_start = self.direct_start
        return handler

    def _make_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: web.RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        request = StampedRequest(message, payload, protocol, writer, task, self._loop)
        if isinstance(protocol, StampingRequestHandler):
            stamps = protocol.rx_stamps
            if stamps:
                request.t0_ns = stamps.popleft()
            protocol.open_requests += 1
            request.open = True
        return request


class StampedRequest(web.BaseRequest):
    """A request that knows when its headers were read."""

    t0_ns: int | None = None
    open: bool = False
    """Counted in its connection's ``open_requests``."""


def t0_ns_of(request: web.BaseRequest) -> int:
    """The request's headers-read time (``perf_counter_ns``), or now when unknown."""
    stamp = getattr(request, "t0_ns", None)
    return stamp if isinstance(stamp, int) else perf_counter_ns()
