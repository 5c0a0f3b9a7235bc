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
    """aiohttp's server protocol, noting when each request's headers were read."""

    __slots__ = ("rx_stamps",)

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.rx_stamps: deque[int] = deque()

    def data_received(self, data: bytes) -> None:
        now = perf_counter_ns()
        queue = getattr(self, "_messages", None)
        if queue is None:
            super().data_received(data)
            return
        before = len(queue)
        super().data_received(data)
        for _ in range(len(queue) - before):
            self.rx_stamps.append(now)


class StampingServer(web.Server):
    """``web.Server`` whose connections are :class:`StampingRequestHandler`."""

    def __call__(self) -> web.RequestHandler:
        return StampingRequestHandler(self, loop=self._loop, **self._kwargs)

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
