"""A request served without aiohttp: from the callback that read it to the end of its body.

For a request that arrives whole in one read, plain, on a connection with nothing else open
(:mod:`llmtop.proxy.stamping`), aiohttp's parse, its request and payload objects, its
handler task and the loop turns in between are most of what the proxy spends on the
request beyond the bytes themselves. :class:`DirectExchange` serves such a request from
callbacks instead: the request goes upstream from the protocol's ``data_received``; the
upstream connection hands over the response head from its own read callback
(``head_ready``), which opens the relay (:meth:`llmtop.proxy.server.ProxyServer.open_relay`,
the same code as aiohttp's path); the end of the relay (told a loop turn later, see
:meth:`~llmtop.proxy.relay.RelaySink.listen`) publishes the record and hands the connection
back to its protocol. An open request keeps few objects: the garbage collector walks them
all at each collection, with the forwarding loop stopped.

Anything unusual — the upstream failing or closing before its head, a kept-alive
connection found closed (retried on a fresh one), an upstream refusing the injected
``stream_options`` — goes on in a task through the ordinary request path
(:meth:`llmtop.proxy.server.ProxyServer.forward`), which reads the request through
:class:`DirectClient`; an error response it makes is written to the transport as bytes.
Timeouts, a client that leaves and shutdown end a direct request exactly as they end a
handler: the same outcomes, statuses and record.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import TYPE_CHECKING

from aiohttp import web

from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.quickhead import QuickRequest
from llmtop.proxy.relay import (
    SHUTDOWN_REASON,
    ClientGone,
    Exchange,
    RelaySink,
    UpstreamBroken,
    Watchdog,
    close_then_drop,
    cut_off,
)
from llmtop.proxy.response import SentResponse, response_head
from llmtop.proxy.stamping import StampingRequestHandler
from llmtop.proxy.upstream import ResponseHead, UpstreamConnection

if TYPE_CHECKING:
    from llmtop.proxy.server import ProxyServer

CLIENT_GONE = 499
"""Status recorded for a request whose client left before any response (nginx's 499)."""


class DirectClient:
    """A directly served request as the proxy's request path reads it: the part of
    aiohttp's ``BaseRequest`` that :meth:`ProxyServer.forward` and :meth:`open_relay`
    use. It is its own ``writer`` (the relay's flow control: :meth:`drain`)."""

    __slots__ = ("_protocol", "content_length", "keep_alive", "method", "raw_headers",
                 "raw_path", "version")

    def __init__(self, quick: QuickRequest, protocol: StampingRequestHandler) -> None:
        self.method = quick.method
        self.version = quick.version
        self.keep_alive = quick.keep_alive
        self.raw_headers = quick.raw_headers
        self.raw_path = quick.target
        self.content_length = len(quick.body) if quick.has_length else None
        self._protocol = protocol

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._protocol.transport

    @property
    def protocol(self) -> StampingRequestHandler:
        return self._protocol

    @property
    def writer(self) -> DirectClient:
        return self

    async def drain(self) -> None:
        """Wait until the client's transport has drained (aiohttp's protocol keeps the
        waiter)."""
        await self._protocol._drain_helper()


class DirectExchange:
    """One request served from callbacks (see the module docstring). Made by
    :meth:`ProxyServer.direct_start` after it has sent the request upstream on ``conn``;
    ``head`` is that request's response-head future."""

    __slots__ = ("_waiters", "body", "client", "conn", "ex", "finished", "head", "info",
                 "inject", "keep_alive", "protocol", "raw", "server", "sink", "task", "wd")

    def __init__(self, server: ProxyServer, protocol: StampingRequestHandler,
                 client: DirectClient, ex: Exchange, conn: UpstreamConnection,
                 head: asyncio.Future[ResponseHead], raw: bytes, inject: bool, body: bytes,
                 info: RequestInfo) -> None:
        self.server = server
        self.protocol = protocol
        self.client = client
        self.ex = ex
        self.conn: UpstreamConnection | None = conn
        """The upstream connection while this exchange owns it."""
        self.head: asyncio.Future[ResponseHead] | None = head
        """The response head's future until the head has come (then it and the head are
        let go: an open request keeps few objects for the garbage collector to walk)."""
        self.raw = raw
        """The request as sent upstream, ``body`` as the client sent it and ``info``, for
        the task that carries on an unusual case — until the head has come (a request is
        never sent again after it: a long prompt is not held for the whole answer)."""
        self.inject = inject
        self.body = body
        self.info: RequestInfo | None = info
        self.sink: RelaySink | None = None
        self.task: asyncio.Task[None] | None = None
        """The task carrying on the unusual cases (None while served from callbacks)."""
        self.keep_alive = False
        """The relayed response leaves the connection open."""
        self.finished = False
        self._waiters: list[asyncio.Future[None]] | None = None
        self.wd = Watchdog(self, server.sweeper)
        self.wd.arm(server.cfg.timeouts.first_byte_s, "first byte")
        # the head comes from the connection's own read callback, not the future's: the
        # relay attaches in that callback, and the bytes read with the head go out in it
        conn.head_ready = self._on_head

    # -- the usual course ------------------------------------------------------------

    def _on_head(self, head: ResponseHead | None) -> None:
        """The response head (None: it failed, the head future says why), called by the
        upstream connection as it reads it."""
        if self.finished:
            return
        try:
            # (a 400 or 422 to an injected stream_options may be its refusal: the task
            # sends the request again without it)
            if head is None or self.conn is None or (
                    self.inject and head.status in (400, 422)):
                self._carry_on()
            else:
                self.head = self.info = None
                self.raw = self.body = b""
                self.client.raw_headers = ()
                self._relay(head)
        except Exception as exc:  # a bug of ours: end the request, never the proxy
            self._internal_error(exc)

    def _relay(self, head: ResponseHead) -> None:
        server, conn = self.server, self.conn
        assert conn is not None
        server.upstream_down = False
        try:
            # open_relay's completion frees the request and the upstream connection as the
            # end of the body goes out; the record follows a loop turn later, in relay_ended
            sink, self.keep_alive = server.open_relay(self.client, self.ex, self.wd, conn,
                                                      head, self.inject, None)
        except ClientGone:
            self._drop_upstream()
            self.ex.fail("cancelled", "client disconnected")
            self._finish(False)
            return
        self.sink = sink
        sink.listen(self)

    def relay_ended(self, exc: BaseException | None) -> None:
        """The relay has ended (``exc`` None: the body went out in full), a loop turn
        before (:meth:`RelaySink.listen`)."""
        if self.finished:
            return
        sink, ex = self.sink, self.ex
        assert sink is not None
        if exc is None:
            self.conn = None  # back in the pool (complete())
            try:
                self._relayed(sink)
            except Exception as bug:
                self._internal_error(bug)
                return
            self._finish(self.keep_alive)
            return
        self._drop_upstream()
        if isinstance(exc, UpstreamBroken) and not sink.head_sent:
            # broke before the head went out: a whole 502 (see ProxyServer._relay)
            self._write_error(self.server.upstream_broke_early(ex, exc))
            self._finish(self.client.keep_alive)
            return
        if isinstance(exc, UpstreamBroken):
            ex.fail("error", str(exc))
            transport = self.protocol.transport
            if transport is not None:  # (a client that does not read is dropped in time)
                close_then_drop(transport, self.server.cfg.timeouts.idle_s)
        else:
            ex.fail("cancelled", "client disconnected")
            self._close_client()
        self._finish(False)

    def _relayed(self, sink: RelaySink) -> None:
        sink.finish()
        self.server.relay_outcome(self.ex, sink)

    def _internal_error(self, exc: Exception) -> None:
        ex = self.ex
        why = f"llmtop internal error: {type(exc).__name__}"
        self._drop_upstream()
        if self.sink is not None:
            self.sink.cancel()
        if not ex.headers_sent:
            self._write_error(self.server.proxy_error(ex, ex.active.dialect, 500, "error",
                                                      why, "internal_error"))
        ex.fail("error", why)
        self._close_client()
        self._finish(False)

    # -- ends ---------------------------------------------------------------------------

    def cancel(self) -> bool:
        """The watchdog fired: the upstream was silent too long."""
        if self.finished or (self.sink is not None and self.sink.completed):
            return False
        if self.task is not None:
            return self.task.cancel()
        ex, wd = self.ex, self.wd
        self._drop_upstream()
        if self.sink is None:  # no head yet: answer 504
            self._write_error(self.server.proxy_error(
                ex, ex.active.dialect, 504, "timeout",
                f"upstream {wd.phase} timed out after {wd.limit_ns / 1e9:g} s",
                "upstream_timeout"))
            self._finish(self.client.keep_alive)
            return True
        self.sink.cancel()
        ex.fail(*cut_off(wd, self.protocol.transport, self.sink))
        self._finish(False)
        return True

    def uncancel(self) -> int:
        return 0

    def client_lost(self) -> None:
        """The client's connection closed."""
        self._stop(self.server.cancel_reason())

    def shut(self) -> None:
        """Shutdown's grace is over: end the request now (recorded cancelled)."""
        self._stop(SHUTDOWN_REASON)
        self._close_client()

    def _stop(self, reason: str) -> None:
        if self.finished:
            return
        if self.task is not None:
            self.task.cancel()  # the task records it as the handler would
            return
        sink = self.sink
        if sink is not None and sink.completed:  # delivered in full already
            self.conn = None
            self._relayed(sink)
            self._finish(False)
            return
        self._drop_upstream()
        ex = self.ex
        if sink is not None:
            sink.cancel()
        else:
            ex.status = CLIENT_GONE
        ex.fail("cancelled", reason)
        ex.end_ns = perf_counter_ns()
        self._finish(False)

    def _drop_upstream(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.head_ready = None
            conn.abort()  # the engine sees the disconnect now and stops generating
        head = self.head
        if head is not None and not head.done():
            head.cancel()

    def _close_client(self) -> None:
        transport = self.protocol.transport
        if transport is not None:
            transport.close()

    def _write_error(self, resp: web.Response) -> None:
        transport = self.protocol.transport
        if transport is None or transport.is_closing():
            return
        body = resp.body if isinstance(resp.body, bytes) else b""
        frame = response_head(self.client.version, self.client.method, resp.status,
                              b"", [(b"Content-Type", b"application/json")],
                              length=len(body), stream=False,
                              keep_alive=self.client.keep_alive)
        transport.write(frame.head + body)

    def _finish(self, keep_alive: bool) -> None:
        self.finished = True
        self.wd.disown()  # no reference cycles: freed as it ends
        self.sink = None
        server = self.server
        server.direct_ended(self)
        server.ended(self.ex)
        waiters, self._waiters = self._waiters, None
        for w in waiters or ():
            if not w.done():
                w.set_result(None)
        self.protocol.direct_done(self, keep_alive)

    def ended(self) -> asyncio.Future[None]:
        """A future resolved when this request has ended (for shutdown's grace)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.finished:
            fut.set_result(None)
        else:
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(fut)
        return fut

    # -- the unusual cases: in a task, the ordinary way ----------------------------------

    def _carry_on(self) -> None:
        self.wd.stop()
        self.task = asyncio.ensure_future(self._forward())
        self.server.direct_task(self.task)

    async def _forward(self) -> None:
        task = self.task
        assert task is not None
        server, ex = self.server, self.ex
        conn, self.conn = self.conn, None
        assert self.head is not None and self.info is not None  # (before the head came)
        # forward holds the request's bytes until its head has come, and no longer
        forwarding = server.forward(self.client, ex, Watchdog(task, server.sweeper),
                                    self.body, self.info,
                                    Started(conn, self.head, self.raw, self.inject))
        self.raw = self.body = b""
        keep_alive = False
        try:
            resp = await forwarding
            if isinstance(resp, SentResponse):
                keep_alive = resp.keep_alive
            elif isinstance(resp, web.Response):
                self._write_error(resp)
                keep_alive = self.client.keep_alive
        except asyncio.CancelledError:
            self._close_client()
        except Exception as exc:  # a bug of ours: answer 500 as aiohttp would
            why = f"llmtop internal error: {type(exc).__name__}"
            if not ex.headers_sent:
                self._write_error(server.proxy_error(ex, ex.active.dialect, 500, "error",
                                                     why, "internal_error"))
            ex.fail("error", why)
            self._close_client()
        finally:
            self._finish(keep_alive)


class Started:
    """A request already sent upstream on ``conn`` (``head``: its response-head future),
    for :meth:`ProxyServer.forward` to carry on from."""

    __slots__ = ("conn", "head", "inject", "raw")

    def __init__(self, conn: UpstreamConnection | None, head: asyncio.Future[ResponseHead],
                 raw: bytes, inject: bool) -> None:
        self.conn = conn
        self.head = head
        self.raw = raw
        self.inject = inject

