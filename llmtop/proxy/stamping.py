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
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import perf_counter_ns
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader


class StampingRequestHandler(web.RequestHandler):
    """aiohttp's server protocol, noting when each request's headers were read — and
    closing a connection that sends no complete request head for ``head_timeout_s``
    (after it opens, and after each response): aiohttp's server has no header timeout,
    so a client sending half a request head would hold its connection for ever."""

    __slots__ = ("_head_since", "_head_timer", "head_timeout_s", "rx_stamps")

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.rx_stamps: deque[int] = deque()
        self.head_timeout_s: float | None = None
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

    def data_received(self, data: bytes) -> None:
        now = perf_counter_ns()
        queue = getattr(self, "_messages", None)
        if queue is None:
            super().data_received(data)
            return
        before = len(queue)
        super().data_received(data)
        added = len(queue) - before
        if added > 0:
            self._head_since = None
            for _ in range(added):
                self.rx_stamps.append(now)

    def resume_reading(self, resume_parser: bool = True) -> None:
        # aiohttp's StreamReader calls this after every read of a request body, paused or
        # not; with nothing paused it would re-enter data_received(b"") and resume the
        # transport for nothing (a dozen calls a request)
        if getattr(self, "_reading_paused", True) or getattr(self, "_buffer_paused", True):
            super().resume_reading(resume_parser)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        out = await super().finish_response(request, resp, start_time)
        if not getattr(self, "_messages", None):
            self._await_head()
        return out

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

    def __init__(self, *args: Any, head_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s

    def __call__(self) -> web.RequestHandler:
        handler = StampingRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.head_timeout_s = self.head_timeout_s
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
        stamps = getattr(protocol, "rx_stamps", None)
        if stamps:
            request.t0_ns = stamps.popleft()
        return request


class StampedRequest(web.BaseRequest):
    """A request that knows when its headers were read."""

    t0_ns: int | None = None


def t0_ns_of(request: web.BaseRequest) -> int:
    """The request's headers-read time (``perf_counter_ns``), or now when unknown."""
    stamp = getattr(request, "t0_ns", None)
    return stamp if isinstance(stamp, int) else perf_counter_ns()
