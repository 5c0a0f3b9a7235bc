"""The reverse proxy: every method and path forwarded to the upstream, observed on the way.

:class:`ProxyServer` binds ``cfg.listen`` with aiohttp's low-level server (no router, no
middlewares, no access log: one handler for every request) and keeps a pool of keep-alive
connections to ``cfg.upstream`` (:mod:`llmtop.proxy.upstream`, a lean HTTP/1.1 client).
Per request it reads the body (up to ``cfg.max_body_bytes``), names the user, sends the
request upstream, passes status and headers back as soon as they arrive and relays the
body with :class:`llmtop.proxy.relay.RelaySink`, which writes each upstream read to the
client from the very callback that delivered it. Each finished request becomes one
:class:`~llmtop.events.RequestRecord` on the bus; requests in flight are visible in
:attr:`ProxyServer.active`.

Fidelity: the response body reaches the client byte for byte (nothing is decompressed:
gzip bodies pass through unchanged and are timed as dialect ``other``, since the parser
cannot read them); request headers go upstream byte for byte, less hop-by-hop fields;
only the usage-only SSE event that the proxy itself asked for is removed
(``inject_usage``). The one header added is ``X-Accel-Buffering: no`` on
streams, so a buffering proxy in front of llmtop does not batch chunks.

Outcomes: ``ok``; ``error`` (upstream status ≥ 400, a malformed stream, a stream that broke
off — still forwarded as-is; unreachable upstream → 502; body too big → 413);
``cancelled`` (the client went away — the upstream connection is closed at once so the
engine stops generating — or the proxy shut down); ``timeout`` (upstream connect, first
byte or idle timeout → 504 in the API's own error shape, or the stream is cut off when the
response had already started).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
import time
from dataclasses import dataclass
from time import perf_counter_ns
from typing import cast

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import StreamReader

from llmtop.bus import EventBus
from llmtop.config import Config, ConfigError, parse_hostport
from llmtop.events import ActiveRequest, Dialect
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.openai import (
    UsageChunkStripper,
    add_include_usage,
    is_usage_rejection,
)
from llmtop.proxy.dialects.registry import detect_dialect, inspect_request, make_parser
from llmtop.proxy.errors import error_response
from llmtop.proxy.headers import upstream_request_headers
from llmtop.proxy.identity import IdentityResolver
from llmtop.proxy.quickhead import QuickRequest
from llmtop.proxy.relay import (
    ClientGone,
    Exchange,
    RelaySink,
    UpstreamBroken,
    Watchdog,
    WatchdogSweeper,
)
from llmtop.proxy.response import response_head, sent_response
from llmtop.proxy.stamping import (
    StampingRequestHandler,
    StampingServer,
    claim_early,
    t0_ns_of,
)
from llmtop.proxy.upstream import (
    BufferSink,
    ConnectFailed,
    ConnectTimeout,
    ResponseHead,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
)

_STREAM_TYPES = frozenset({"text/event-stream", "application/x-ndjson", "application/ndjson",
                           "application/jsonl", "application/x-jsonlines",
                           "application/jsonlines"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_OWN_PARSER_ERROR = re.compile(
    r"malformed JSON( body| in stream event| line in stream)?"
    r"|line longer than \d+ bytes discarded|SSE event larger than \d+ bytes discarded")
"""The dialect parsers' own messages (no upstream text in them)."""
_CLIENT_GONE = 499
"""Status recorded for a request whose client left before any response (nginx's 499)."""


@dataclass(frozen=True, slots=True)
class ShutdownSummary:
    """How :meth:`ProxyServer.shutdown` ended the requests that were in flight."""

    finished_in_grace: int
    cancelled: int


@dataclass(slots=True, eq=False)
class _Early:
    """A request sent upstream from its connection's ``data_received``, before its handler
    ran (``early_start`` in :mod:`llmtop.proxy.stamping`). ``conn`` is None once the
    handler has taken it over, or the start was undone or abandoned."""

    server: ProxyServer
    ex: Exchange
    body: bytes
    info: RequestInfo
    conn: UpstreamConnection | None
    head: asyncio.Future[ResponseHead]
    raw: bytes
    inject: bool

    def abandon(self) -> None:
        self.server._abandon(self)

    def undo(self) -> None:
        self.server._undo(self)


class ProxyServer:
    """The proxy on ``cfg.listen`` in front of ``cfg.upstream``.

    ``active`` holds the requests open now (shared with whoever shows in-flight counts);
    ``upstream_down`` is True after a failed upstream connect until the next success.
    ``concurrency_at_start`` of a request counts the requests open at its t0 *including
    itself* (a lone request has 1).
    """

    def __init__(
        self, cfg: Config, bus: EventBus, active: dict[str, ActiveRequest] | None = None
    ) -> None:
        self.cfg = cfg
        self.bus = bus
        self.active: dict[str, ActiveRequest] = active if active is not None else {}
        self.upstream_down = False
        self.concurrency_elsewhere = 0
        """Requests open in sibling worker processes (``--workers N``), added to each new
        request's ``concurrency_at_start`` so capacity bins count the whole proxy."""
        self.usage_rejected = False
        """The upstream refused ``stream_options`` once: injection is off from then on."""
        self.early_starts = 0
        """Requests sent upstream from their connection's ``data_received`` (early start)."""
        self.early_undone = 0
        """Early starts undone (aiohttp read the request differently, or the bookkeeping
        after the send failed)."""
        self._base = cfg.upstream.rstrip("/")
        self._identity = IdentityResolver(cfg.user_header, cfg.user_salt)
        self._pool: UpstreamPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop serving (kept: asyncio.get_running_loop() is a getpid() on 3.11)."""
        self._runner: web.ServerRunner | None = None
        self._handlers: set[asyncio.Task[object]] = set()
        self._closing = False
        self._ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(4)
        t = cfg.timeouts
        # timeouts are checked by one sweep for all requests, often enough to fire within
        # a tenth of the shortest limit (at most every 0.5 s, at least every 10 ms)
        self._sweeper = WatchdogSweeper(min(0.5, max(0.01, min(t.first_byte_s, t.idle_s) / 10)))

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, *, reuse_port: bool = False) -> str:
        """Bind ``cfg.listen`` and serve; returns ``http://HOST:PORT`` actually bound."""
        if not self._base:
            raise ConfigError("upstream is not set (--upstream URL)")
        host, port = parse_hostport(self.cfg.listen, "listen")
        self._loop = asyncio.get_running_loop()
        self._pool = UpstreamPool(self._base, self.cfg.timeouts.connect_s)
        self._sweeper.start()
        # handler_cancellation: a client that leaves cancels its handler at once, even while
        # the upstream is still silent; auto_decompress off: request bodies pass unchanged
        # head_timeout_s: a connection that sends no complete request head for idle_s
        # (half a head, or an idle keep-alive connection) is closed
        server = StampingServer(self._handle, handler_cancellation=True, access_log=None,
                                auto_decompress=False,
                                head_timeout_s=self.cfg.timeouts.idle_s,
                                early_start=self._early_start)
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_port=reuse_port or None,
                           backlog=4096)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            self._pool.close()
            await self._sweeper.stop()
            raise
        bound = port
        for addr in self._runner.addresses:
            bound = int(addr[1])
            break
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{bound}"

    async def shutdown(self, grace_s: float | None = None) -> ShutdownSummary:
        """Stop accepting; let requests in flight finish within ``grace_s`` (default
        ``cfg.timeouts.shutdown_grace_s``), cancel the rest (recorded ``cancelled``), close
        the upstream session."""
        grace = self.cfg.timeouts.shutdown_grace_s if grace_s is None else grace_s
        runner = self._runner
        finished = cancelled = 0
        if runner is not None:
            for site in list(runner.sites):
                await site.stop()
            if runner.server is not None:
                runner.server.pre_shutdown()  # idle keep-alive connections close now
            pending = set(self._handlers)
            if pending:
                _, still = await asyncio.wait(pending, timeout=max(grace, 0.0))
                finished = len(pending) - len(still)
                self._closing = True
                for task in still:
                    task.cancel()
                if still:
                    await asyncio.wait(still, timeout=5.0)
                cancelled = len(still)
            self._closing = True
            await runner.cleanup()
            self._runner = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        await self._sweeper.stop()
        return ShutdownSummary(finished_in_grace=finished, cancelled=cancelled)

    # -- one request -------------------------------------------------------------------

    def _begin(self, method: str, path: str, content_type: str | None, t0_ns: int,
               dialect: Dialect | None = None) -> Exchange:
        """A new request, registered as open; ``t0_ns``: when its headers were read
        (shared/docs/domain.md). The wall-clock anchor is taken now and moved back to t0."""
        t_start = time.time() - (perf_counter_ns() - t0_ns) / 1e9
        rid = f"{self._id_prefix}-{next(self._ids):x}"
        if dialect is None:
            dialect = detect_dialect(method, path, content_type, self.cfg.dialect)
        active = ActiveRequest(
            id=rid, user="", model=None, dialect=dialect, path=path, stream=False,
            t_start=t_start, t0_ns=t0_ns,
            concurrency_at_start=len(self.active) + 1 + self.concurrency_elsewhere,
        )
        self.active[rid] = active
        return Exchange(active)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # t0: noted by the server protocol when the request line and headers came off the
        # socket (stamping.py), a few loop turns before this handler runs — or the request
        # was begun, and maybe sent upstream, right there (early start)
        early = claim_early(request)
        if isinstance(early, _Early):
            ex = early.ex
        else:
            ex = self._begin(request.method, request.path, request.headers.get("Content-Type"),
                             t0_ns_of(request))
            early = None
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._handlers.add(task)
        try:
            if early is None:
                return await self._serve(request, ex, task)
            return await self._forward(request, ex, Watchdog(task, self._sweeper), early.body,
                                       early.info, early)
        except Exception as exc:  # a bug of ours: aiohttp answers 500; the record says so
            if not ex.headers_sent:
                ex.status = 500
            ex.fail("error", f"llmtop internal error: {type(exc).__name__}")
            raise
        finally:
            self._handlers.discard(task)
            self.active.pop(ex.active.id, None)
            self.bus.publish(ex.to_record())

    def _early_start(self, quick: QuickRequest, protocol: StampingRequestHandler, t0_ns: int
                     ) -> _Early | None:
        """Called first thing in the connection's ``data_received`` when the read holds
        exactly one plain request and nothing else is open on the connection: when a pooled
        upstream connection is idle, send the request now, then do the bookkeeping — the
        parse and loop turns until its handler runs are then spent while the upstream works.
        HEAD, bodies over the limit, no idle connection and shutting down are left to the
        handler."""
        pool = self._pool
        if (pool is None or self._closing or quick.method == "HEAD"
                or len(quick.body) > self.cfg.max_body_bytes):
            return None
        conn = pool.take_idle()
        if conn is None:
            return None
        body = quick.body
        try:
            # the path decides the dialect (detect_dialect does not read the content type)
            dialect = detect_dialect(quick.method, quick.path, None, self.cfg.dialect)
            info = inspect_request(dialect, quick.path, body)
            raw, inject = self._upstream_request(
                quick.method, quick.target, quick.raw_headers, quick.has_length, body, info,
                dialect)
            head = conn.send(raw, False)
        except Exception:  # a bug of ours: the handler sends it the ordinary way
            pool.release(conn)
            return None
        headers = quick.headers()
        ex = self._begin(quick.method, quick.path, None, t0_ns, dialect)
        early = _Early(self, ex, body, info, conn, head, raw, inject)
        try:
            active = ex.active
            transport = protocol.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            remote = str(peer[0]) if isinstance(peer, list | tuple) else (
                None if peer is None else str(peer))
            active.user = self._identity.resolve(headers, info.user, remote)
            active.model = info.model
            active.stream = ex.stream = info.stream
        except Exception:
            self._undo(early)
            return None
        self.early_starts += 1
        return early

    def _undo(self, early: _Early) -> None:
        """Stop an early start without a record (the ordinary path takes the request)."""
        self.early_undone += 1
        self._drop_upstream(early)
        self.active.pop(early.ex.active.id, None)

    def _abandon(self, early: _Early) -> None:
        """The connection of an early-started request closed before its handler ran."""
        self._drop_upstream(early)
        ex = early.ex
        ex.status = _CLIENT_GONE
        ex.fail("cancelled", self._cancel_reason())
        ex.end_ns = perf_counter_ns()
        self.active.pop(ex.active.id, None)
        self.bus.publish(ex.to_record())

    @staticmethod
    def _drop_upstream(early: _Early) -> None:
        """Close an early start's upstream connection (the engine sees the disconnect at
        once and stops generating); nobody will wait for its head."""
        conn, early.conn = early.conn, None
        if conn is not None:
            conn.abort()
        if not early.head.done():
            early.head.cancel()

    async def _serve(
        self, request: web.BaseRequest, ex: Exchange, task: asyncio.Task[object]
    ) -> web.StreamResponse:
        active = ex.active
        dialect = active.dialect
        limit = self.cfg.max_body_bytes
        declared = request.content_length
        # the request's timeouts: a client that stops sending its body, then the upstream
        wd = Watchdog(task, self._sweeper)
        idle_s = self.cfg.timeouts.idle_s
        content = request.content
        try:
            if declared is not None and declared > limit:
                body = None
            elif content.is_eof():  # the whole body came with the head: nothing to wait for
                body = content.read_nowait()
                if len(body) > limit:
                    body = None
            else:
                wd.arm(idle_s, "request body")
                await _continue_if_expected(request)
                body = await _read_body(content, limit, wd)
        except asyncio.CancelledError:
            if not wd.fired:
                ex.status = _CLIENT_GONE
                ex.fail("cancelled", self._cancel_reason())
                raise
            wd.absorb()
            resp = self._proxy_error(ex, dialect, 408, "timeout",
                                     f"client sent no body for {idle_s:g} s", "request_timeout")
            resp.force_close()
            return resp
        finally:
            wd.stop()
        if body is None:
            active.user = self._identity.resolve(request.headers, None, request.remote)
            ex.status = 413
            ex.fail("error", f"request body over max_body_bytes ({limit})")
            resp = error_response(dialect, 413, f"request body is larger than {limit} bytes",
                                  "request_too_large")
            resp.force_close()
            ex.end_ns = perf_counter_ns()
            return resp
        info = inspect_request(dialect, active.path, body)
        active.user = self._identity.resolve(request.headers, info.user, request.remote)
        active.model = info.model
        active.stream = ex.stream = info.stream
        return await self._forward(request, ex, wd, body, info)

    def _cancel_reason(self) -> str:
        return "proxy shut down" if self._closing else "client disconnected"

    def _upstream_request(self, method: str, target: str,
                          raw_headers: tuple[tuple[bytes, bytes], ...], length_declared: bool,
                          body: bytes, info: RequestInfo, dialect: Dialect,
                          ) -> tuple[bytes, bool]:
        """The request's bytes as they go upstream, and whether ``stream_options`` was
        injected into its body (``inject_usage``)."""
        pool = self._pool
        assert pool is not None
        headers = upstream_request_headers(raw_headers)
        with_length = bool(body) or method in _BODY_METHODS or length_declared
        inject = (
            dialect == "openai" and self.cfg.inject_usage and info.stream
            and not info.wants_usage and not self.usage_rejected
        )
        sent = _with_usage(body) if inject else None
        if sent is None:
            inject = False
            sent = body
        return pool.request_bytes(method, target, headers, sent, with_length), inject

    async def _forward(
        self,
        request: web.BaseRequest,
        ex: Exchange,
        wd: Watchdog,
        body: bytes,
        info: RequestInfo,
        started: _Early | None = None,
    ) -> web.StreamResponse:
        cfg = self.cfg
        dialect = ex.active.dialect
        pool, loop = self._pool, self._loop
        assert pool is not None and loop is not None
        method = request.method
        if started is not None:
            raw, inject = started.raw, started.inject
        else:
            raw, inject = self._upstream_request(
                method, _target(request), request.raw_headers,
                request.content_length is not None, body, info, dialect)
        conn: UpstreamConnection | None = None
        early: bytes | None = None
        try:
            try:
                wd.arm(cfg.timeouts.first_byte_s, "first byte")
                conn, head = await self._exchange(pool, raw, method == "HEAD", started)
                if inject and head.status in (400, 422):
                    buffered = BufferSink(loop)
                    conn.attach(buffered)
                    early = await buffered.done
                    if is_usage_rejection(head.status, early):
                        pool.release(conn)
                        conn, early = None, None
                        self.usage_rejected = True
                        inject = False
                        wd.arm(cfg.timeouts.first_byte_s, "first byte")
                        plain, _ = self._upstream_request(
                            method, _target(request), request.raw_headers,
                            request.content_length is not None, body, info, dialect)
                        conn, head = await self._exchange(pool, plain, method == "HEAD")
                    else:
                        inject = False
                self.upstream_down = False
            except ConnectTimeout as exc:
                return self._proxy_error(ex, dialect, 504, "timeout",
                                         f"upstream connect timed out: {exc}", "upstream_timeout")
            except ConnectFailed as exc:
                self.upstream_down = True
                return self._proxy_error(ex, dialect, 502, "error",
                                         f"upstream unreachable: {exc}", "upstream_unreachable")
            except UpstreamError as exc:
                if conn is not None:
                    conn.abort()
                return self._proxy_error(ex, dialect, 502, "error",
                                         f"upstream failed before responding: {exc}",
                                         "upstream_error")
            except asyncio.CancelledError:
                if conn is not None:
                    conn.abort()  # the engine sees the disconnect now and stops generating
                if not wd.fired:
                    ex.status = _CLIENT_GONE
                    ex.fail("cancelled", self._cancel_reason())
                    raise
                wd.absorb()
                return self._proxy_error(ex, dialect, 504, "timeout",
                                         f"upstream {wd.phase} timed out after "
                                         f"{wd.limit_ns / 1e9:g} s", "upstream_timeout")
            return await self._relay(request, ex, wd, pool, conn, head, inject, early)
        finally:
            wd.stop()

    async def _exchange(
        self, pool: UpstreamPool, raw: bytes, head_request: bool, started: _Early | None = None
    ) -> tuple[UpstreamConnection, ResponseHead]:
        """Send one request and wait for the response head; once more on a fresh connection
        when a reused keep-alive connection turns out to have been closed by the upstream.
        ``started``: the request went out early on ``started.conn``; wait for its head."""
        if started is not None and started.conn is not None:
            conn, head = started.conn, started.head
            started.conn = None  # this handler owns the connection from now on
        else:
            conn = await pool.acquire()
            head = conn.send(raw, head_request)
        try:
            return conn, await head
        except UpstreamClosed as exc:
            conn.abort()
            if not exc.retryable:
                raise
        except BaseException:
            conn.abort()
            raise
        conn = await pool.acquire(fresh=True)
        try:
            return conn, await conn.send(raw, head_request)
        except BaseException:
            conn.abort()
            raise

    async def _relay(
        self,
        request: web.BaseRequest,
        ex: Exchange,
        wd: Watchdog,
        pool: UpstreamPool,
        conn: UpstreamConnection,
        head: ResponseHead,
        inject: bool,
        early: bytes | None,
    ) -> web.StreamResponse:
        """Send status and headers at once, then the body as it comes."""
        loop = self._loop
        assert loop is not None
        status = head.status
        ex.status = status
        ctype = head.content_type
        strip = UsageChunkStripper() if inject and status < 300 else None
        media = ctype.split(";", 1)[0].strip().lower()
        if media in _STREAM_TYPES:
            is_stream = True
        elif media == "application/json" or media.endswith("+json"):
            is_stream = False
        else:
            is_stream = ex.stream  # the response does not say: as the request asked
        ex.stream = ex.active.stream = is_stream
        frame = response_head(request.version, request.method, status, head.reason,
                              head.headers, length=head.length if strip is None else None,
                              stream=is_stream, keep_alive=request.keep_alive)
        out = sent_response(frame.keep_alive)
        encoding = head.content_encoding.lower()
        parser_dialect: Dialect = ex.active.dialect
        if encoding not in ("", "identity"):
            parser_dialect = "other"  # compressed bytes pass through; not parsed
        parser = make_parser(parser_dialect, ex.stream, ctype or None)
        ex.parser = parser
        sink: RelaySink | None = None
        protocol = request.protocol

        def complete() -> None:
            # the end of the body is out: the request is no longer open, the upstream
            # connection is free, and the client's next request on this connection may
            # start early (the handler, woken a moment later, publishes the record)
            self.active.pop(ex.active.id, None)
            pool.release(conn)
            if isinstance(protocol, StampingRequestHandler):
                protocol.request_done(request)

        try:
            transport = request.transport
            if transport is None:
                raise ClientGone("client disconnected")
            wd.arm(self.cfg.timeouts.idle_s, "idle")
            sink = RelaySink(ex, parser, strip, transport, frame.head, frame.chunked,
                             protocol, cast(StreamWriter, request.writer), conn, wd, loop,
                             complete)
            ex.headers_sent = True
            if early is not None:
                if early:
                    sink.on_last(early)
                else:
                    sink.on_end()
            else:
                conn.attach(sink)  # body bytes that came with the head go out with it
                sink.send_head()
            await sink.done
            sink.finish()
        except UpstreamBroken as exc:
            conn.abort()
            ex.fail("error", str(exc))
            return _abort(request)
        except ConnectionError:
            conn.abort()
            ex.fail("cancelled", "client disconnected")
            return sent_response(keep_alive=False)
        except asyncio.CancelledError:
            if sink is not None and sink.completed:
                sink.finish()
                if not wd.fired:
                    raise  # delivered in full (the connection went back to the pool)
            else:
                conn.abort()  # the engine sees the disconnect now and stops generating
            if sink is not None:
                sink.cancel()
            if not wd.fired:
                ex.fail("cancelled", self._cancel_reason())
                raise
            wd.absorb()
            ex.fail("timeout", f"upstream idle for {wd.limit_ns / 1e9:g} s mid-response")
            return _abort(request)
        # the body ended cleanly: complete() already gave the connection back to the pool
        if status >= 400:
            ex.fail("error", f"upstream answered HTTP {status}")
        elif parser.error:
            ex.fail("error", self._stream_error(parser.error))
        return out

    def _stream_error(self, error: str) -> str:
        """The record's ``error`` for a stream the parser found wrong. llmtop's own findings
        (malformed framing) are kept; an error the *upstream* wrote may quote the prompt
        (validation errors often do), so its text is kept only with
        ``recording.record_content`` on."""
        if _OWN_PARSER_ERROR.fullmatch(error):
            return f"malformed stream: {error}"
        if self.cfg.recording.record_content:
            return f"upstream error event: {error}"
        return "upstream error event"

    def _proxy_error(
        self, ex: Exchange, dialect: Dialect, status: int, outcome: str, message: str,
        code: str,
    ) -> web.StreamResponse:
        ex.status = status
        ex.fail("timeout" if outcome == "timeout" else "error", message)
        ex.end_ns = perf_counter_ns()
        return error_response(dialect, status, message, code)


_USAGE_OPTION = b'"stream_options":{"include_usage":true},'


def _with_usage(body: bytes) -> bytes | None:
    """``body`` asking for usage in the stream. Called only for a body ``inspect_request``
    read as a JSON object with ``"stream": true`` and no usage asked for, so when the bytes
    hold no ``stream_options`` at all the option is spliced in after the opening brace
    without parsing the body a second time (long prompts make that parse cost ~ms);
    otherwise ``add_include_usage`` merges it into the client's ``stream_options``."""
    if b'"stream_options"' not in body:
        rest = body.lstrip(b" \t\r\n")
        i = len(body) - len(rest)
        if rest[:1] == b"{" and body[i + 1:i + 2] != b"\x00":
            return body[:i + 1] + _USAGE_OPTION + body[i + 1:]
    return add_include_usage(body)


def _target(request: web.BaseRequest) -> str:
    """The request target as the client wrote it (path and query, still encoded)."""
    raw = request.raw_path
    if raw.startswith("/"):
        return raw
    return request.rel_url.raw_path_qs


async def _continue_if_expected(request: web.BaseRequest) -> None:
    """Answer ``Expect: 100-continue`` (the low-level server leaves it to the handler)."""
    if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


async def _read_body(content: StreamReader, limit: int, wd: Watchdog) -> bytes | None:
    """The whole request body, or None once it exceeds ``limit`` bytes (each read resets
    the idle watchdog)."""
    parts: list[bytes] = []
    size = 0
    while True:
        data = await content.readany()
        if not data:
            break
        wd.last_ns = perf_counter_ns()
        size += len(data)
        if size > limit:
            return None
        parts.append(data)
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


def _abort(request: web.BaseRequest) -> web.StreamResponse:
    """End a response that has already started and cannot end cleanly: close the client's
    connection without the end of the body, so the client sees a truncated response."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return sent_response(keep_alive=False)
