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

Two ways in, one way through: a plain request that arrives whole in one read is served
directly from the connection's callbacks (:meth:`ProxyServer.direct_start`,
:mod:`llmtop.proxy.direct`, without aiohttp's request machinery); every other request
goes through aiohttp's server to :meth:`ProxyServer._handle`. Both send upstream with the
same bytes (:meth:`ProxyServer._upstream_request`), relay with the same code
(:meth:`ProxyServer.open_relay`) and end with the same outcomes and record; the unusual
cases of a direct request go on through :meth:`ProxyServer.forward` like any handler's.

Fidelity: the response body reaches the client byte for byte (nothing is decompressed:
a gzip or deflate body passes through unchanged while its parser reads an inflated copy;
``br`` and other encodings are timed as dialect ``other``); request headers go upstream
byte for byte, less hop-by-hop fields — except ``Accept-Encoding``, set to ``identity``
on a request whose body llmtop edited to ask for usage; only the usage-only SSE event that
the proxy itself asked for is removed (``inject_usage``). The one header added is
``X-Accel-Buffering: no`` on a stream whose upstream did not send the field, so a
buffering proxy in front of llmtop does not batch chunks (and ``Date`` and ``Server``
when the upstream sent none, :mod:`llmtop.proxy.response`).

Outcomes: ``ok``; ``error`` (upstream status ≥ 400, a malformed stream, a stream that broke
off — still forwarded as-is; unreachable upstream → 502; body too big → 413);
``cancelled`` (the client went away — the upstream connection is closed at once so the
engine stops generating —, stopped reading a started response for ``idle_s`` while the
upstream waited on it, or the proxy shut down); ``timeout`` (upstream connect, first
byte or idle timeout → 504 in the API's own error shape, or the stream is cut off when the
response had already started).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, Protocol

from aiohttp import web
from aiohttp.streams import StreamReader

from llmtop import http_errors_log
from llmtop.bus import EventBus
from llmtop.clock import unix_at_ns
from llmtop.config import Config, ConfigError, parse_hostport
from llmtop.events import CONNECT_TIMEOUT_PREFIX, UNREACHABLE_PREFIX, ActiveRequest, Dialect
from llmtop.fleet_counts import FleetCounts
from llmtop.listen import start_tcp
from llmtop.out_of_files import is_out_of_files, out_of_files, refusal
from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.compressed import INFLATABLE, InflatingParser
from llmtop.proxy.dialects.openai import (
    OpenAIStreamParser,
    add_include_usage,
    is_usage_rejection,
)
from llmtop.proxy.dialects.openai_usage import stripper_for
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.registry import (
    BODY_DECIDES,
    detect_dialect,
    inspect_request,
    make_parser,
)
from llmtop.proxy.direct import CLIENT_GONE, DirectClient, DirectExchange, Started
from llmtop.proxy.errors import error_response
from llmtop.proxy.headers import upstream_field_lines
from llmtop.proxy.identity import IdentityResolver
from llmtop.proxy.quickhead import MAX_FIELDS, MAX_LINE, QuickRequest
from llmtop.proxy.relay import (
    SHUTDOWN_REASON,
    ClientGone,
    Drainable,
    Exchange,
    FlowControlled,
    RelaySink,
    UpstreamBroken,
    Watchdog,
    WatchdogSweeper,
    close_then_drop,
    cut_off,
)
from llmtop.proxy.response import response_head, sent_response
from llmtop.proxy.stamping import StampingRequestHandler, StampingServer, t0_ns_of
from llmtop.proxy.token_rate import TokenRates
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
from llmtop.tls import upstream_ssl

_STREAM_TYPES = frozenset({"text/event-stream", "application/x-ndjson", "application/ndjson",
                           "application/jsonl", "application/x-jsonlines",
                           "application/jsonlines"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_HTTP1 = frozenset({(1, 0), (1, 1)})
"""The versions served (aiohttp reads a request line without one as 0.9, and takes 2.0)."""

_OWN_PARSER_ERROR = re.compile(
    r"malformed JSON( body| in stream event| line in stream)?"
    r"|line longer than \d+ bytes discarded|SSE event larger than \d+ bytes discarded"
    r"|malformed compressed body"
    r"|compressed body inflates past \d+ bytes in one read; not parsed further")
"""The dialect parsers' own messages (no upstream text in them)."""


@dataclass(frozen=True, slots=True)
class ShutdownSummary:
    """How :meth:`ProxyServer.shutdown` ended the requests that were in flight."""

    finished_in_grace: int
    cancelled: int


class ClientRequest(Protocol):
    """What :meth:`ProxyServer.forward` reads of the client's request: aiohttp's
    ``BaseRequest``, or a :class:`~llmtop.proxy.direct.DirectClient`."""

    @property
    def method(self) -> str: ...

    @property
    def version(self) -> tuple[int, int]: ...

    @property
    def keep_alive(self) -> bool: ...

    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]: ...

    @property
    def raw_path(self) -> str: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def protocol(self) -> FlowControlled: ...

    @property
    def writer(self) -> Drainable: ...


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
        self.fleet: FleetCounts | None = None
        """With ``--workers N``: every worker's open requests (:mod:`llmtop.fleet_counts`),
        so each new request's ``concurrency_at_start`` counts the whole proxy's."""
        self.usage_rejected = False
        """The upstream refused ``stream_options`` once, or its usage event held more than
        usage (llama.cpp's ``timings``: it counts its answers itself): injection is off from
        then on. (The streams injected until then gave their clients llama.cpp's
        ``timings`` back where llama.cpp puts them without usage: ``TimingsRestorer``.)"""
        self.token_rates = TokenRates()
        """Per model, the engine's tokens per content event, learned from streams with usage
        and used for streams that end without it (``token_source`` ``estimate``)."""
        self.direct_starts = 0
        """Requests served directly (sent upstream from their connection's
        ``data_received``, without aiohttp: :mod:`llmtop.proxy.direct`)."""
        self._direct: set[DirectExchange] = set()
        """Direct requests open now."""
        self._base = cfg.upstream.rstrip("/")
        self._identity = IdentityResolver(cfg.user_header, cfg.user_salt,
                                          cfg.trusted_proxies)
        self._pool: UpstreamPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop serving (kept: asyncio.get_running_loop() is a getpid() on 3.11)."""
        self._runner: web.ServerRunner | None = None
        self._handlers: set[asyncio.Task[object]] = set()
        self._closing = False
        self._stopping = False
        self._hurried = asyncio.Event()
        """Set by :meth:`hurry`: the shutdown grace ends now."""
        self._ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(4)
        t = cfg.timeouts
        # timeouts are checked by one sweep for all requests, often enough to fire within
        # a tenth of the shortest limit (at most every 0.5 s, at least every 10 ms)
        self._sweeper = WatchdogSweeper(min(0.5, max(0.01, min(t.first_byte_s, t.idle_s) / 10)))

    @property
    def pool(self) -> UpstreamPool | None:
        """The upstream connections (None when not serving)."""
        return self._pool

    @property
    def sweeper(self) -> WatchdogSweeper:
        return self._sweeper

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, *, reuse_port: bool = False) -> str:
        """Bind ``cfg.listen`` and serve; returns ``http://HOST:PORT`` actually bound."""
        if not self._base:
            raise ConfigError("upstream is not set (--upstream URL)")
        host, port = parse_hostport(self.cfg.listen, "listen")
        self._loop = asyncio.get_running_loop()
        self._pool = UpstreamPool(self._base, self.cfg.timeouts.connect_s,
                                  upstream_ssl(self.cfg))
        self._sweeper.start()
        # handler_cancellation: a client that leaves cancels its handler at once, even while
        # the upstream is still silent; auto_decompress off: request bodies pass unchanged
        # head_timeout_s: a connection that sends no complete request head for idle_s
        # (half a head, or an idle keep-alive connection) is closed
        # (the head limits named, as the direct path's reading checks the same ones)
        server = StampingServer(self._handle, handler_cancellation=True, access_log=None,
                                auto_decompress=False, max_line_size=MAX_LINE,
                                max_field_size=MAX_LINE, max_headers=MAX_FIELDS,
                                head_timeout_s=self.cfg.timeouts.idle_s,
                                direct_start=self.direct_start)
        http_errors_log.install()  # a client's malformed request: one line, not a traceback
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        try:
            bound = await start_tcp(self._runner, host, port, reuse_port=reuse_port or None,
                                    backlog=4096)
        except OSError:
            await self._runner.cleanup()
            self._pool.close()
            await self._sweeper.stop()
            raise
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
            self._stopping = True  # no more direct requests
            direct: dict[asyncio.Future[Any], DirectExchange] = {
                x.ended(): x for x in self._direct if x.task is None}
            pending: set[asyncio.Future[Any]] = set(self._handlers)
            pending.update(direct)
            if pending:
                still = await self._grace(pending, grace)
                finished = len(pending) - len(still)
                self._closing = True
                for fut in still:
                    x = direct.get(fut)
                    if x is not None:
                        x.shut()
                    else:
                        fut.cancel()
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

    @property
    def in_flight(self) -> int:
        """Requests being served now (generation or not)."""
        return len(self._handlers) + sum(1 for x in self._direct if x.task is None)

    def hurry(self) -> None:
        """End the shutdown's grace now (a second SIGINT/SIGTERM): streams still open are
        cancelled and counted at once."""
        self._hurried.set()

    async def _grace(self, pending: set[asyncio.Future[Any]], grace_s: float
                     ) -> set[asyncio.Future[Any]]:
        """Wait until ``pending`` have ended, ``grace_s`` has passed or :meth:`hurry`;
        returns those still open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace_s, 0.0)
        hurried = asyncio.ensure_future(self._hurried.wait())
        still = set(pending)
        try:
            while still and not self._hurried.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait(still | {hurried}, timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                still -= done
        finally:
            hurried.cancel()
        return still

    # -- one request -------------------------------------------------------------------

    def _begin(self, method: str, path: str, content_type: str | None, t0_ns: int,
               dialect: Dialect | None = None) -> Exchange:
        """A new request, registered as open; ``t0_ns``: when its headers were read
        (shared/docs/domain.md). The wall-clock anchor is taken now and moved back to t0."""
        t_start = unix_at_ns(t0_ns)
        rid = f"{self._id_prefix}-{next(self._ids):x}"
        if dialect is None:
            dialect = detect_dialect(method, path, content_type, self.cfg.dialect)
        fleet = self.fleet
        active = ActiveRequest(
            id=rid, user="", model=None, dialect=dialect, path=path, stream=False,
            t_start=t_start, t0_ns=t0_ns,
            concurrency_at_start=len(self.active) + 1 + (fleet.others() if fleet else 0),
        )
        ex = Exchange(active)
        if method not in _BODY_METHODS:  # not a generation: forwarded, not measured
            ex.measured = False
            return ex
        self.active[rid] = active
        if fleet is not None:  # (and one more opened: a killed worker's unreported ones)
            fleet.opened_one(len(self.active))
        return ex

    def ended(self, ex: Exchange) -> None:
        """``ex``'s request is over: no longer open, and its record published (a request
        that is not a generation has none)."""
        self.closed(ex)
        if ex.measured:
            self.failed_before_cancel(ex)
            self.bus.publish(ex.to_record(self.token_rates))

    def failed_before_cancel(self, ex: Exchange) -> None:
        """A request recorded ``cancelled`` whose stream had already failed (an error event
        or line from the upstream, or data the parser found malformed) failed first: its
        outcome is ``error``, with the error ``relay_outcome`` gives a body that ends
        after the failure. The parser reads a read only after it went out to an open client
        connection, so the client had the failure before it left — and the SDKs leave on
        it: ollama's client raises on a mid-stream ``{"error": ...}``, text-generation on a
        TGI error event, all of them on malformed JSON, closing the stream while the
        upstream still holds it open (QA: recorded ``cancelled``, ``client disconnected``,
        and not counted among the errors)."""
        parser = ex.parser
        if ex.outcome != "cancelled" or parser is None or parser.error is None:
            return
        ex.outcome = "ok"  # (``fail`` keeps the first outcome: the failure replaces it)
        self._failed(ex, parser.error)

    def closed(self, ex: Exchange) -> None:
        """``ex``'s request is no longer open."""
        if not ex.measured:
            return
        self.active.pop(ex.active.id, None)
        if self.fleet is not None:
            self.fleet.set_mine(len(self.active))

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # t0: noted by the server protocol when the request line and headers came off the
        # socket (stamping.py), a few loop turns before this handler runs
        # (an absolute-form target with an empty path, http://host, is the path /)
        ex = self._begin(request.method, request.path or "/",
                         request.headers.get("Content-Type"), t0_ns_of(request))
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._serve(request, ex, task)
        except Exception as exc:  # a bug of ours: aiohttp answers 500; the record says so
            if not ex.headers_sent:
                ex.status = 500
            ex.fail("error", f"llmtop internal error: {type(exc).__name__}")
            raise
        finally:
            self._handlers.discard(task)
            self.ended(ex)

    def direct_start(self, quick: QuickRequest, protocol: StampingRequestHandler,
                     t0_ns: int) -> DirectExchange | None:
        """Called first thing in the connection's ``data_received`` when the read holds
        exactly one plain request and nothing else is open on the connection: when a pooled
        upstream connection is idle, send the request now, do the bookkeeping after, and
        serve it without aiohttp (:mod:`llmtop.proxy.direct`). HEAD, CONNECT, bodies over
        the limit, no idle connection and shutting down are left to aiohttp's path."""
        pool = self._pool
        # (an Upgrade field never gets here: read_request leaves such a request to aiohttp)
        if (pool is None or self._stopping or quick.method in ("HEAD", "CONNECT")
                or len(quick.body) > self.cfg.max_body_bytes):
            return None
        conn = pool.take_idle()
        if conn is None:
            return None
        body = quick.body
        try:
            # the path decides the dialect (detect_dialect does not read the content type)
            dialect = detect_dialect(quick.method, quick.path, None, self.cfg.dialect, body)
            info = inspect_request(dialect, quick.path, body)
            raw, inject = self._upstream_request(
                quick.method, quick.target, quick.raw_headers, quick.has_length, body, info,
                dialect)
            head = conn.send(raw, False)
        except Exception:  # a bug of ours: aiohttp's path sends it the ordinary way
            pool.release(conn)
            return None
        ex = self._begin(quick.method, quick.path, None, t0_ns, dialect)
        active = ex.active
        try:
            transport = protocol.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            remote = str(peer[0]) if isinstance(peer, list | tuple) else (
                None if peer is None else str(peer))
            active.user = self._identity.resolve_raw(quick.raw_headers, info.user, remote)
        except Exception:  # a bug of ours: the request goes on, its user unnamed
            active.user = ""
        active.model = info.model
        active.stream = ex.stream = info.stream
        if info.prompts > 1:
            ex.prompt_list = (info.prompts, info.n)
        ex.slices = self.bus  # an open stream's chunks, as it goes (relay.hold)
        direct = DirectExchange(self, protocol, DirectClient(quick, protocol), ex, conn, head,
                                raw, inject, body, info)
        self._direct.add(direct)
        self.direct_starts += 1
        return direct

    def direct_task(self, task: asyncio.Task[None]) -> None:
        """A direct request goes on in ``task`` (shutdown waits for it as for a handler)."""
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def direct_ended(self, direct: DirectExchange) -> None:
        self._direct.discard(direct)

    async def _serve(
        self, request: web.BaseRequest, ex: Exchange, task: asyncio.Task[object]
    ) -> web.StreamResponse:
        active = ex.active
        dialect = active.dialect
        if request.version not in _HTTP1:
            return self._refuse_version(request, ex)
        if request.method == "CONNECT":  # a tunnel: llmtop is a reverse proxy
            # (QA: it went upstream as "CONNECT  HTTP/1.1", the target lost, and a 2xx
            # answer was relayed without framing, leaving the client waiting)
            resp = self.proxy_error(
                ex, dialect, 501, "error",
                "a reverse proxy: CONNECT tunnels are not opened",
                "connect_not_supported")
            resp.force_close()
            return resp
        upgrade = request.headers.get("Upgrade")
        if upgrade is not None and not _h2c_only(upgrade):  # a WebSocket upgrade: not relayed
            resp = self.proxy_error(
                ex, dialect, 501, "error",
                f"protocol upgrades are not relayed ({request.headers['Upgrade'][:40]}):"
                " connect to the upstream directly for this endpoint", "upgrade_not_supported")
            resp.force_close()
            return resp
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None:  # (never on the direct path: read_request leaves it here)
            refused = self._refuse_coding(request, ex, coding)
            if refused is not None:
                return refused
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
            # the body never came whole: the user as the headers and the address name them
            active.user = self._identity.resolve(request.headers, None, request.remote)
            if not wd.fired:
                ex.status = CLIENT_GONE
                ex.fail("cancelled", self.cancel_reason())
                raise
            wd.absorb()
            resp = self.proxy_error(ex, dialect, 408, "timeout",
                                    f"client sent no body for {idle_s:g} s", "request_timeout")
            resp.force_close()
            return await _answer_and_close(request, resp)
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
        if dialect in BODY_DECIDES:  # TGI's POST /, SGLang's /generate: by the body
            dialect = active.dialect = detect_dialect(request.method, active.path, None,
                                                      self.cfg.dialect, body)
        info = inspect_request(dialect, active.path, body)
        active.user = self._identity.resolve(request.headers, info.user, request.remote)
        active.model = info.model
        active.stream = ex.stream = info.stream
        if info.prompts > 1:
            ex.prompt_list = (info.prompts, info.n)
        ex.slices = self.bus  # an open stream's chunks, as it goes (relay.hold)
        forwarding = self.forward(request, ex, wd, body, info)
        del body  # forward holds it until the response head has come, and no longer
        return await forwarding

    def _refuse_version(self, request: web.BaseRequest, ex: Exchange) -> web.StreamResponse:
        """A request in a version other than HTTP/1.0 or 1.1: a line without a version
        (``GET /path``), which aiohttp reads as HTTP/0.9, or ``HTTP/2.0`` in an HTTP/1
        request line, which aiohttp's parser accepts. Answered 505 in HTTP/1.0 and closed
        (QA: the first was relayed with the status line ``HTTP/0.9 200 OK``, which no
        client reads; desync checks: the second was relayed upstream and answered
        ``HTTP/2.0 200 OK`` with HTTP/1 framing. aiohttp's own responses would say the
        client's version too, so the proxy writes this one itself)."""
        major, minor = request.version
        resp = self.proxy_error(ex, ex.active.dialect, 505, "error",
                                f"HTTP/{major}.{minor} is not served: send HTTP/1.0 or HTTP/1.1",
                                "http_version_not_supported")
        body = resp.body if isinstance(resp.body, bytes) else b""
        frame = response_head((1, 0), request.method, 505, b"",
                              [(b"Content-Type", b"application/json")], length=len(body),
                              stream=False, keep_alive=False)
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.write(frame.head + body)
            transport.close()
        return sent_response(keep_alive=False)

    def _refuse_coding(self, request: web.BaseRequest, ex: Exchange, coding: str
                       ) -> web.StreamResponse | None:
        """A request body's transfer coding that is not exactly ``chunked`` in HTTP/1.1,
        answered and closed (None: served). aiohttp's parser de-chunks a body whose last
        coding is chunked and leaves any coding before it on the bytes
        (``Transfer-Encoding: gzip, chunked``): the proxy would send them upstream under a
        ``Content-Length`` with no word of the coding, a body the upstream reads as
        something else — 501, as RFC 9112 6.1 asks of a coding the server does not
        implement. In an HTTP/1.0 request ``Transfer-Encoding`` means faulty framing
        (RFC 9112 6.1: an HTTP/1.0 peer frames that body otherwise) — 400."""
        dialect = ex.active.dialect
        if request.version < (1, 1):
            resp = self.proxy_error(ex, dialect, 400, "error",
                                    "Transfer-Encoding in an HTTP/1.0 request",
                                    "bad_request")
        elif coding.strip(" \t").lower() != "chunked":
            resp = self.proxy_error(ex, dialect, 501, "error",
                                    f"transfer coding not implemented ({coding[:40]}): "
                                    "only chunked", "transfer_coding_not_supported")
        else:
            return None
        active = ex.active
        active.user = self._identity.resolve(request.headers, None, request.remote)
        resp.force_close()
        return resp

    def cancel_reason(self) -> str:
        return SHUTDOWN_REASON if self._closing else "client disconnected"

    def _upstream_request(self, method: str, target: str,
                          raw_headers: tuple[tuple[bytes, bytes], ...], length_declared: bool,
                          body: bytes, info: RequestInfo, dialect: Dialect,
                          ) -> tuple[bytes, bool]:
        """The request's bytes as they go upstream, and whether ``stream_options`` was
        injected into its body (``inject_usage``)."""
        pool = self._pool
        assert pool is not None
        with_length = bool(body) or method in _BODY_METHODS or length_declared
        inject = (
            dialect == "openai" and self.cfg.inject_usage and info.stream
            and not info.wants_usage and not info.sends_usage and not self.usage_rejected
        )
        sent = _with_usage(body) if inject else None
        if sent is None:
            inject = False
            sent = body
        # with usage injected, Accept-Encoding says identity: the usage event llmtop asks
        # for must be removed again, which a compressed stream does not allow (identity is
        # always acceptable; HTTP clients decode either the same)
        fields = upstream_field_lines(raw_headers, identity_encoding=inject)
        return pool.request_bytes(method, target, fields, sent, with_length), inject

    async def forward(
        self,
        request: ClientRequest,
        ex: Exchange,
        wd: Watchdog,
        body: bytes,
        info: RequestInfo,
        started: Started | None = None,
    ) -> web.StreamResponse:
        """Send the request upstream (or carry on from ``started``, a request already sent)
        and relay the response; the record's outcome is set on ``ex``."""
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
                self.upstream_down = True  # a host that drops connection attempts is down
                return self.proxy_error(ex, dialect, 504, "timeout",
                                        f"{CONNECT_TIMEOUT_PREFIX}: {exc}", "upstream_timeout")
            except ConnectFailed as exc:
                if is_out_of_files(exc.os_error):  # llmtop's own limit: the engine is fine
                    out_of_files.note_refusal(exc.os_error.errno if exc.os_error else None)
                    return self.proxy_error(ex, dialect, 502, "error", refusal(),
                                            "proxy_out_of_files")
                self.upstream_down = True
                return self.proxy_error(ex, dialect, 502, "error",
                                        f"{UNREACHABLE_PREFIX}: {exc}", "upstream_unreachable")
            except UpstreamError as exc:
                if conn is not None:
                    conn.abort()
                return self.proxy_error(ex, dialect, 502, "error",
                                        f"upstream failed before responding: {exc}",
                                        "upstream_error")
            except asyncio.CancelledError:
                if conn is not None:
                    conn.abort()  # the engine sees the disconnect now and stops generating
                if not wd.fired:
                    ex.status = CLIENT_GONE
                    ex.fail("cancelled", self.cancel_reason())
                    raise
                wd.absorb()
                return self.proxy_error(ex, dialect, 504, "timeout",
                                        f"upstream {wd.phase} timed out after "
                                        f"{wd.limit_ns / 1e9:g} s", "upstream_timeout")
            # the head has come: the request is never sent again, so its bytes are not
            # held while the answer streams (a long prompt, twice over, per open stream)
            raw = body = b""
            if started is not None:
                started.raw = b""
            return await self._relay(request, ex, wd, pool, conn, head, inject, early)
        finally:
            wd.stop()

    async def _exchange(
        self, pool: UpstreamPool, raw: bytes, head_request: bool, started: Started | None = None
    ) -> tuple[UpstreamConnection, ResponseHead]:
        """Send one request and wait for the response head; once more on a fresh connection
        when a reused keep-alive connection turns out to have been closed by the upstream.
        ``started``: the request went out already on ``started.conn``; wait for its head."""
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
        request: ClientRequest,
        ex: Exchange,
        wd: Watchdog,
        pool: UpstreamPool,
        conn: UpstreamConnection,
        head: ResponseHead,
        inject: bool,
        early: bytes | None,
    ) -> web.StreamResponse:
        """Send status and headers at once, then the body as it comes."""
        sink: RelaySink | None = None
        keep_alive = False
        try:
            sink, keep_alive = self.open_relay(request, ex, wd, conn, head, inject, early)
            await sink.done
            sink.finish()
        except UpstreamBroken as exc:
            conn.abort()
            if sink is not None and not sink.head_sent:
                # the body broke in the read that brought the head (bad chunked framing),
                # before anything went out: a whole 502, not a connection closed with no
                # response at all (QA: an upstream chunk size of "-5")
                return self.upstream_broke_early(ex, exc)
            ex.fail("error", str(exc))
            return _abort(request, self.cfg.timeouts.idle_s)
        except ConnectionError:
            conn.abort()
            ex.fail("cancelled", "client disconnected")
            return sent_response(keep_alive=False)
        except asyncio.CancelledError:
            if sink is not None and sink.completed:
                sink.finish()
                if not wd.fired:
                    # delivered in full (the connection went back to the pool)
                    self.relay_outcome(ex, sink)
                    raise
            else:
                conn.abort()  # the engine sees the disconnect now and stops generating
            if sink is not None:
                sink.cancel()
            if not wd.fired:
                ex.fail("cancelled", self.cancel_reason())
                raise
            wd.absorb()
            ex.fail(*cut_off(wd, request.transport, sink))
            return sent_response(keep_alive=False)
        # the body ended cleanly: complete() already gave the connection back to the pool
        self.relay_outcome(ex, sink)
        return sent_response(keep_alive)

    def open_relay(
        self,
        request: ClientRequest,
        ex: Exchange,
        wd: Watchdog,
        conn: UpstreamConnection,
        head: ResponseHead,
        inject: bool,
        early: bytes | None,
    ) -> tuple[RelaySink, bool]:
        """Start relaying the response whose ``head`` came on ``conn``: the status and
        headers go out at once (with any body bytes that came with them), the body as it
        comes (``early``: the whole body, already read). Returns the sink (its ``done``
        resolves at the end of the body) and whether the client's connection stays open.
        Raises :class:`ClientGone` when the client has gone already."""
        loop, pool = self._loop, self._pool
        assert loop is not None and pool is not None
        protocol = request.protocol
        status = head.status
        ex.status = status
        if head.request_id is not None:  # the engine's id (the body's, else: the parser's)
            ex.active.upstream_id = head.request_id
        ctype = head.content_type
        # (llama.cpp's first streams: a stripper that gives its timings back, see
        # openai_usage.TimingsRestorer)
        strip = stripper_for(head.headers) if inject and status < 300 else None
        media = ctype.split(";", 1)[0].strip().lower()
        if media in _STREAM_TYPES:
            is_stream = True
        elif media == "application/json" or media.endswith("+json"):
            is_stream = False
        else:
            is_stream = ex.stream  # the response does not say: as the request asked
        if status < 400:
            # the record's ``stream``: whether the answer was streamed; an error page is
            # never streamed, so for errors it stays what the request asked (QA: upstream
            # 4xx/5xx said false but the proxy's own 502/504 true, for the same request)
            ex.stream = ex.active.stream = is_stream
        frame = response_head(request.version, request.method, status, head.reason,
                              head.headers, length=head.length if strip is None else None,
                              stream=is_stream, keep_alive=request.keep_alive)
        encoding = head.content_encoding.lower()
        parser: StreamParser
        if encoding in ("", "identity"):
            parser = (make_parser(ex.active.dialect, is_stream, ctype or None, ex.active.path)
                      if status < 400 or ex.active.dialect != "other" else PlainParser(False))
        else:  # compressed bytes pass through; the parser reads an inflated copy if it can
            # (a compressed body cannot be edited: the usage event is not removed — llmtop
            # asks for an uncompressed answer whenever it would have to, see _upstream_request)
            strip = None
            parser = (InflatingParser(make_parser(ex.active.dialect, is_stream, ctype or None,
                                                  ex.active.path), encoding)
                      if encoding in INFLATABLE else PlainParser(status < 400))
        if ex.prompt_list is not None and isinstance(parser, OpenAIStreamParser):
            parser.several_prompts(*ex.prompt_list)  # their prompt tokens summed
        ex.parser = ex.active.usage = parser  # (the live row reads the prompt's size there)
        transport = request.transport
        if transport is None:
            raise ClientGone("client disconnected")
        wd.arm(self.cfg.timeouts.idle_s, "idle")
        sink = RelaySink(ex, parser, strip, transport, frame.head, frame.chunked,
                         protocol, request.writer, conn, wd, loop,
                         _Completion(self, ex, pool, conn, request))
        ex.headers_sent = True
        if early is not None:
            if early:
                sink.on_last(early)
            else:
                sink.on_end()
        else:
            conn.attach(sink)  # body bytes that came with the head go out with it
            sink.send_head()
        if sink.head_sent:  # the live row's status from now on (once, not per chunk)
            ex.active.status = status
        return sink, frame.keep_alive

    def upstream_broke_early(self, ex: Exchange, exc: Exception) -> web.Response:
        """The 502 for a response whose body broke before its head went to the client."""
        ex.headers_sent = False
        return self.proxy_error(ex, ex.active.dialect, 502, "error",
                                "upstream sent a malformed response: "
                                + str(exc).removeprefix("upstream stream broke: "),
                                "upstream_error")

    def relay_outcome(self, ex: Exchange, sink: RelaySink) -> None:
        """After a body relayed in full: an error status or a stream the parser found
        wrong makes the outcome ``error``. For an error status the record's ``error`` is
        ``upstream answered HTTP 400`` plus the kind the error body gave, when it gave one
        (``upstream answered HTTP 400 (invalid_request_error/context_length_exceeded)``,
        see ``_upstream_error``)."""
        if sink.usage_extra_fields:
            self.usage_rejected = True
        self._failed(ex, sink.parser_error)

    def _failed(self, ex: Exchange, parser_error: str | None) -> None:
        """``ex``'s outcome ``error`` when its status is an error or its parser found the
        stream wrong (``parser_error``), with the record's ``error`` for it."""
        kind = ex.parser.error_kind if ex.parser is not None else None
        if ex.status >= 400:
            ex.fail("error", self._upstream_error(f"upstream answered HTTP {ex.status}",
                                                  parser_error, kind))
        elif parser_error:
            ex.fail("error", self._stream_error(parser_error, kind))

    def _stream_error(self, error: str, kind: str | None = None) -> str:
        """The record's ``error`` for a stream the parser found wrong. llmtop's own findings
        (malformed framing) are kept; an error the *upstream* wrote is
        ``upstream error event`` plus its kind (``upstream error event (overloaded_error)``,
        see ``_upstream_error``)."""
        if _OWN_PARSER_ERROR.fullmatch(error):
            return f"malformed stream: {error}"
        return self._upstream_error("upstream error event", error, kind)

    def _upstream_error(self, what: str, text: str | None, kind: str | None) -> str:
        """``what`` the upstream did, then its error's ``kind`` in parentheses when the
        parser found one (a short identifier or number — ``type``/``code`` of the error,
        never free text: ``dialects._common.error_kind``), so errors group by status and
        kind (a context overflow, a bad model name, a rate limit, an engine OOM). The
        upstream's own message ``text`` may quote the prompt (validation errors often do),
        so it follows (``: text``) only with ``recording.record_content`` on — and never
        llmtop's own parser findings on an error page (``malformed JSON body``)."""
        if kind:
            what = f"{what} ({kind})"
        if text and self.cfg.recording.record_content and not _OWN_PARSER_ERROR.fullmatch(text):
            return f"{what}: {text}"
        return what

    def proxy_error(
        self, ex: Exchange, dialect: Dialect, status: int, outcome: str, message: str,
        code: str,
    ) -> web.Response:
        ex.status = status
        ex.fail("timeout" if outcome == "timeout" else "error", message)
        ex.end_ns = perf_counter_ns()
        return error_response(dialect, status, message, code)


_USAGE_OPTION = b'"stream_options":{"include_usage":true},'


class _Completion:
    """What :meth:`ProxyServer.open_relay` does as the end of a body goes out (the relay's
    ``on_complete``, just before that write): the request is no longer open, the upstream
    connection is free, and the client's next request on its connection may be served
    directly (the record follows when the relay's owner wakes). One object a request,
    where a closure was a function and six cells: fewer objects for the garbage collector
    to walk while the request is open."""

    __slots__ = ("conn", "ex", "pool", "protocol", "request", "server")

    def __init__(self, server: ProxyServer, ex: Exchange, pool: UpstreamPool,
                 conn: UpstreamConnection, request: ClientRequest) -> None:
        self.server = server
        self.ex = ex
        self.pool = pool
        self.conn = conn
        self.request = request
        self.protocol = request.protocol

    def __call__(self) -> None:
        self.server.closed(self.ex)
        self.pool.release(self.conn)
        protocol = self.protocol
        if isinstance(protocol, StampingRequestHandler):
            protocol.request_done(self.request)


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


async def _answer_and_close(request: web.BaseRequest, resp: web.Response) -> web.Response:
    """Write ``resp`` and close the connection at once. aiohttp would otherwise linger
    after it, reading the rest of the body for up to 10 s (its ``lingering_time``) — but a
    client that stopped sending its body sends no more: the connection was held that long,
    or until the next-head timeout (``idle_s``) closed it."""
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:  # the client left as the answer went out
        pass
    request.protocol.force_close()
    return resp


def _h2c_only(upgrade: str) -> bool:
    """``Upgrade`` offers only HTTP/2 over cleartext (``curl --http2 http://…`` sends it
    on every request). A server may ignore an upgrade and answer in HTTP/1.1 (RFC 9110
    7.8), as the engine itself does; the field is hop-by-hop, so the request goes upstream
    without it (QA: such requests were answered 501 while the engine answered 200)."""
    tokens = {t.strip().lower() for t in upgrade.split(",")}
    return tokens == {"h2c"}


def _target(request: ClientRequest) -> str:
    """The request target as the client wrote it (path and query, still encoded); an
    absolute-form target (``http://host/path``) as its path and query, ``/`` for an empty
    path (RFC 9112 3.3: ``http://host?x`` asks for ``/?x``; it went upstream as ``?x``, and
    ``http://host`` as no target at all)."""
    raw = request.raw_path
    if raw.startswith("/") or not isinstance(request, web.BaseRequest):
        return raw
    target = request.rel_url.raw_path_qs  # (``*`` for OPTIONS's asterisk-form)
    return "/" + target if target[:1] in ("", "?") else target


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


def _abort(request: ClientRequest, grace_s: float) -> web.StreamResponse:
    """End a response that has already started and cannot end cleanly: close the client's
    connection without the end of the body, so the client sees a truncated response (and
    drop it if the client has not read what it was sent within ``grace_s``)."""
    transport = request.transport
    if transport is not None:
        close_then_drop(transport, grace_s)
    return sent_response(keep_alive=False)
