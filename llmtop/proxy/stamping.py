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

Early start: aiohttp's parse and those loop turns also sit between a request's arrival and
its departure upstream — on an idle machine, with cold caches, about half a millisecond.
So when one read holds exactly one plain request (:func:`llmtop.proxy.quickhead.read_request`)
on a connection with no other request open, the server's ``early_start`` hook is called
with it first thing in ``data_received``; the proxy sends the request upstream from there
(when a pooled connection is idle), and its handler, a few turns later, carries on from the
upstream's answer. aiohttp then parses the same bytes as always; if its request differs
from the quick reading (or it rejects the bytes), the early start is undone (``undo()``)
and the request goes the ordinary way. The protocol holds the started request until the
handler claims it (:func:`claim_early`); if the connection is lost first (the handler then
never runs), it is ended through its ``abandon()``.
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

from llmtop.proxy.quickhead import QuickRequest, read_request


class EarlyStart(Protocol):
    """A request the proxy started from ``data_received`` (see the module docstring)."""

    def abandon(self) -> None:
        """The connection closed before the handler claimed it: end it and record it."""

    def undo(self) -> None:
        """aiohttp read the request differently: stop it, leave no trace (the ordinary
        path handles the request)."""


EarlyHook = Callable[[QuickRequest, "StampingRequestHandler", int], EarlyStart | None]
"""``(request, protocol, t0_ns)`` → the started request, or None to leave the request to
its handler."""


class StampingRequestHandler(web.RequestHandler):
    """aiohttp's server protocol, noting when each request's headers were read — and
    closing a connection that sends no complete request head for ``head_timeout_s``
    (after it opens, and after each response): aiohttp's server has no header timeout,
    so a client sending half a request head would hold its connection for ever."""

    __slots__ = ("_head_since", "_head_timer", "early", "early_payload", "early_start",
                 "head_timeout_s", "open_requests", "rx_stamps")

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.rx_stamps: deque[int] = deque()
        self.head_timeout_s: float | None = None
        self.early_start: EarlyHook | None = None
        self.early: EarlyStart | None = None
        """The request started early and not yet claimed by its handler."""
        self.early_payload: StreamReader | None = None
        """Its body stream: the handler's request is matched to it by this."""
        self.open_requests = 0
        """Requests handed to a handler whose response is not written in full yet."""
        self._head_since: float | None = None  # loop time since a head is awaited
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        early, self.early, self.early_payload = self.early, None, None
        if early is not None:
            early.abandon()

    def data_received(self, data: bytes) -> None:
        now = perf_counter_ns()
        queue = getattr(self, "_messages", None)
        if queue is None:
            super().data_received(data)
            return
        early: EarlyStart | None = None
        quick: QuickRequest | None = None
        start = self.early_start
        # nothing else open on this connection (pipelined requests keep their order)
        if start is not None and not queue and not self.open_requests and self.early is None:
            quick = read_request(data)
            if quick is not None:
                try:
                    early = start(quick, self, now)
                except Exception:  # never at the cost of the connection: the ordinary way
                    early = None
        before = len(queue)
        super().data_received(data)
        added = len(queue) - before
        if added > 0:
            self._head_since = None
            for _ in range(added):
                self.rx_stamps.append(now)
        if early is not None:
            assert quick is not None
            message, payload = queue[-1] if added == 1 else (None, None)
            if (isinstance(message, RawRequestMessage) and payload is not None
                    and payload.is_eof() and message.method == quick.method
                    and message.path == quick.target and message.version == quick.version
                    and not message.upgrade):
                self.early, self.early_payload = early, payload
            else:
                early.undo()

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

    def request_done(self, request: web.BaseRequest) -> None:
        """``request``'s response is written in full (by the relay as its last byte goes
        out, or when aiohttp finishes it, whichever comes first): the next request on this
        connection may start early."""
        if isinstance(request, StampedRequest) and request.open:
            request.open = False
            self.open_requests = max(0, self.open_requests - 1)

    def _await_head(self) -> None:
        """From now on a complete request head is due within ``head_timeout_s``. One timer
        per connection, re-armed lazily when it fires early."""
        limit = self.head_timeout_s
        if limit is None:
            return
        loop = asyncio.get_running_loop()
        self._head_since = loop.time()
        if self._head_timer is None:
            self._head_timer = loop.call_later(limit, self._check_head)

    def _check_head(self) -> None:
        self._head_timer = None
        since, limit = self._head_since, self.head_timeout_s
        if since is None or limit is None:
            return
        loop = asyncio.get_running_loop()
        left = since + limit - loop.time()
        if left > 0:
            self._head_timer = loop.call_later(left, self._check_head)
        elif self.transport is not None:
            self.transport.close()


class StampingServer(web.Server):
    """``web.Server`` whose connections are :class:`StampingRequestHandler`."""

    def __init__(self, *args: Any, head_timeout_s: float | None = None,
                 early_start: EarlyHook | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.early_start = early_start

    def __call__(self) -> web.RequestHandler:
        handler = StampingRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.head_timeout_s
        handler.early_start = self.early_start
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


def claim_early(request: web.BaseRequest) -> EarlyStart | None:
    """The request's early start, taken from its connection (None when it had none)."""
    protocol = request.protocol
    if isinstance(protocol, StampingRequestHandler) and protocol.early is not None and (
            protocol.early_payload is request.content):
        early, protocol.early, protocol.early_payload = protocol.early, None, None
        return early
    return None
