"""One benchmark request, measured as a client sees it.

Times run from the request's **scheduled** send time (open loop: no coordinated omission)
with ``time.perf_counter_ns``; the stream is read with the proxy's own dialect parsers, so
TTFT, chunk times and token counts (``usage`` first, asked for with
``stream_options.include_usage``) mean exactly what they mean for proxied traffic: prompt
tokens are the engine's count from its usage or unknown (``None``), as in the proxy's
record of the same request. A stream that ends before its usage (broken off, stopped) is
counted as the proxy counts it: one token per content event, or — once this client has
learned from complete streams that the model packs several tokens into an event —
estimated at that rate (``token_source`` ``estimate``), so a broken stream from an engine
that packs three tokens an event is not read as a third of its tokens. The
result is a :class:`~llmtop.events.RequestRecord`, the same event the proxy produces, with
its ``upstream_id`` as the proxy gives it too: the response's ``X-Request-Id``, else the id
the body named (the first event's ``chatcmpl-…``/``cmpl-…``), so that a bench run can be
looked up in the engine's logs.

A failed request's ``error`` reads ``"<kind>: <detail>"`` (``connection refused: …``,
``HTTP 500: …``, ``timeout: …``): :func:`error_kind` gives the kind, which the summary counts.

Keep-alive connections that the server has closed: some servers (llama.cpp's llama-server)
close an idle connection without having said ``Connection: close``, so the next request
written on it meets a dead socket. A request that fails that way — on a *reused* connection,
before any of a response arrived — is resent once, on a fresh connection, like llmtop's own
proxy does (:mod:`llmtop.proxy.upstream`). It stays one request (one record), timed from
the resend. Sessions from :func:`bench_session` carry the trace that tells a reused
connection from a new one; with any other session nothing is resent.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from time import perf_counter_ns
from types import SimpleNamespace
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from llmtop.bench.workload import BenchRequest
from llmtop.config import host_field_netloc, socket_netloc
from llmtop.events import Outcome, RequestRecord, TokenSource
from llmtop.net_errors import connect_failure_kind
from llmtop.proxy.chunk_math import ChunkCounts, seconds_since
from llmtop.proxy.dialects._common import upstream_id_text
from llmtop.proxy.dialects.base import StreamParser
from llmtop.proxy.dialects.registry import make_parser
from llmtop.proxy.token_rate import TokenRates

Api = Literal["chat", "completions"]
DONE_GRACE_S = 0.25
"""How long after a stream's end marker (``data: [DONE]``) its body may take to end before
the request is taken as done there (some servers keep the response open after it: every
such request was a timeout to bench, and whole and ok to the proxy)."""
_CONNECT_TIMEOUT: type[Exception] = getattr(aiohttp, "ConnectionTimeoutError",
                                            aiohttp.ServerTimeoutError)
"""A connection not made within ``sock_connect`` (aiohttp < 3.10: its parent, which with
no ``sock_read`` set is raised for nothing else)."""
_ids = itertools.count(1)


@dataclass
class _Attempt:
    """One try at a request: whether it went on a reused connection (set by the session's
    trace) and what of an answer arrived."""

    reused: bool = False
    head: bool = False
    """The response's head arrived (from then on nothing is resent)."""
    status: int = 0
    request_id: str | None = None
    """The response's ``X-Request-Id`` (see :func:`request_id`)."""
    done_ns: int | None = None
    """perf_counter_ns of the read that held the stream's end marker (``[DONE]``)."""
    left_at_done: bool = False
    """The body did not end within :data:`DONE_GRACE_S` of its end marker: the request
    ended there, as the proxy records it (the answer was whole)."""
    streamed: bool = True
    """Whether the answer was a stream: not when a success came as one JSON body (an
    engine that ignores ``stream: true``), as the proxy records it (an error page keeps
    the request's ``stream``, as there)."""
    offsets: array[int] = field(default_factory=lambda: array("q"))
    """perf_counter_ns of each content chunk's read (packed: 8 bytes a chunk, read in place
    when the record is built)."""
    counts: array[int] = field(default_factory=lambda: array("q"))
    parser: StreamParser = field(
        default_factory=lambda: make_parser("openai", True, "text/event-stream"))


async def _on_reuse(session: aiohttp.ClientSession, ctx: SimpleNamespace,
                    params: aiohttp.TraceConnectionReuseconnParams) -> None:
    at = ctx.trace_request_ctx
    if isinstance(at, _Attempt):
        at.reused = True


def bench_session(limit: int) -> aiohttp.ClientSession:
    """A keep-alive session for up to ``limit`` open requests, with the trace
    :meth:`BenchClient.send` needs to resend a request whose reused connection was dead."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    conn = aiohttp.TCPConnector(limit=max(limit, 1) + 8, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None),
                                 trace_configs=[trace])


def _resend(exc: aiohttp.ClientError, at: _Attempt) -> bool:
    """Whether a failed attempt may be sent again on a fresh connection: its connection was
    a reused one and it failed before any of a response. aiohttp hands a partly received
    head to ``ServerDisconnectedError`` as a parsed message rather than a string, so a
    status line that arrived is never resent; a few bytes short of one cannot be told
    from nothing."""
    if not at.reused or at.head or isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)
    return isinstance(exc, aiohttp.ClientOSError)


@dataclass
class BenchClient:
    """Sends OpenAI-compatible streaming requests to ``base_url`` (…/v1 is added)."""

    base_url: str
    api: Api = "chat"
    model: str = "default"
    user: str = "bench"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    connect_timeout_s: float | None = None
    """How long a new connection may take (the config's ``timeouts.connect_s``, as the
    proxy's to its upstream); ``None``: only ``timeout_s``. Without it a target whose
    packets are dropped (down, firewalled) held each request for the whole ``timeout_s``,
    600 s by default, before it counted as a failure."""
    ignore_eos: bool = True
    """Ask the engine to generate exactly max_tokens (vLLM, SGLang, llama.cpp, llmtop sim)."""
    retries: int = 0
    """Requests resent because their kept-alive connection was found dead (each is still
    one request)."""
    rates: TokenRates = field(default_factory=TokenRates)
    """Tokens per stream event, learned per model from this client's streams that carried
    usage, for those that ended without it (see :mod:`llmtop.proxy.token_rate`)."""

    _url: str = field(init=False, repr=False)
    _host: dict[str, str] = field(init=False, repr=False)
    """A Host field without the URL's IPv6 zone, when it has one (else none: aiohttp's)."""

    def __post_init__(self) -> None:
        root = self.base_url.rstrip("/")
        if not root.endswith("/v1"):
            root += "/v1"
        root += "/chat/completions" if self.api == "chat" else "/completions"
        # an IPv6 zone as the upstream path takes it (``llmtop run --upstream``): ``%25``
        # in the URL (RFC 6874) is ``%`` to the resolver, and out of the Host field
        u = urlsplit(root)
        netloc = socket_netloc(u.netloc)
        self._url = urlunsplit(u._replace(netloc=netloc))
        shown = host_field_netloc(u.netloc)
        given = any(k.lower() == "host" for k in self.headers)  # (--header Host: ...)
        self._host = {"Host": shown} if shown != netloc and not given else {}

    def url(self) -> str:
        return self._url

    def body(self, req: BenchRequest) -> bytes:
        common: dict[str, object] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        if self.ignore_eos:
            common["ignore_eos"] = True
        if self.api == "chat":
            common["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            common["prompt"] = req.prompt
        return json.dumps(common).encode()

    async def send(
        self,
        session: aiohttp.ClientSession,
        req: BenchRequest,
        *,
        scheduled_ns: int | None = None,
        concurrency: int = 0,
    ) -> RequestRecord:
        """Send one request; never raises for request failures (they become outcomes).

        Timed from ``scheduled_ns`` (open loop) or from now. A request resent because its
        kept-alive connection was dead (see the module's doc) is timed as if its schedule
        had moved by the time the dead attempt took: closed loop, from the resend; open
        loop, the lag between the scheduled time and the first send still counts. The dead
        socket is this client's connection pool's doing, not time the server spent on the
        request (an llmtop proxy in front resends the same way, and its bench connection
        stays alive), so a direct run and a proxied one compare the time the server took."""
        t0 = perf_counter_ns() if scheduled_ns is None else scheduled_ns
        sent = perf_counter_ns()
        wall = time.time() - (sent - t0) / 1e9
        at = _Attempt()
        outcome: Outcome = "ok"
        error: str | None = None
        try:
            try:
                await self._attempt(session, req, at)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not _resend(exc, at):
                    raise
                lost = perf_counter_ns() - sent
                t0 += lost
                wall += lost / 1e9
                self.retries += 1
                at = _Attempt()
                fresh = aiohttp.TCPConnector(force_close=True, limit=1)
                async with aiohttp.ClientSession(
                        connector=fresh, timeout=aiohttp.ClientTimeout(total=None)) as once:
                    await self._attempt(once, req, at)
            if at.status >= 400:
                outcome = "error"
                error = f"HTTP {at.status}" + (f": {at.parser.error}" if at.parser.error else "")
            elif at.parser.error:
                outcome, error = "error", f"stream error: {at.parser.error}"
        except _CONNECT_TIMEOUT:  # (either limit, while connecting: no connection made)
            outcome = "error"
            limit = min(self.timeout_s, self.connect_timeout_s or self.timeout_s)
            error = f"connect timed out: no connection within {limit:g} s"
        except TimeoutError:
            outcome = "timeout"
            error = f"timeout: no complete response within {self.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            outcome, error = "error", f"{failure_kind(exc)}: {exc}"
        except asyncio.CancelledError:
            outcome, error = "cancelled", "cancelled: benchmark stopped"
            end = perf_counter_ns()
            raise _Cancelled(self._record(t0, wall, end, outcome, error, at, req,
                                          concurrency)) from None
        end = at.done_ns if at.left_at_done and at.done_ns is not None else perf_counter_ns()
        return self._record(t0, wall, end, outcome, error, at, req, concurrency)

    async def _attempt(self, session: aiohttp.ClientSession, req: BenchRequest,
                       at: _Attempt) -> None:
        """One try at the request, its answer read into ``at``; raises what aiohttp does."""
        headers = {"Content-Type": "application/json", "X-LLMTOP-User": self.user,
                   **self._host, **self.headers}
        async with session.post(
            self.url(), data=self.body(req), headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s,
                                          sock_connect=self.connect_timeout_s),
            trace_request_ctx=at,
        ) as resp:
            at.head = True
            at.status = resp.status
            at.request_id = request_id(resp.headers.getall("X-Request-Id", ()))
            at.parser = make_parser("openai", True, resp.content_type)
            media = resp.content_type
            at.streamed = resp.status >= 400 or not (
                media == "application/json" or media.endswith("+json"))
            content = resp.content
            while True:
                if at.done_ns is None:
                    data = await content.readany()
                else:  # the answer is whole: the body's end has a moment to follow
                    try:
                        data = await asyncio.wait_for(content.readany(), DONE_GRACE_S)
                    except TimeoutError:
                        at.left_at_done = True  # (the connection is closed, not reused)
                        break
                if not data:
                    break
                now = perf_counter_ns()
                n, toks = at.parser.feed(data)
                if n:
                    at.offsets.append(now)
                    at.counts.append(toks)
                if at.done_ns is None and at.parser.ended:
                    at.done_ns = now
            n, toks = at.parser.finish()
            if n:
                at.offsets.append(perf_counter_ns())
                at.counts.append(toks)

    def _record(self, t0: int, wall: float, end: int, outcome: Outcome, error: str | None,
                at: _Attempt, req: BenchRequest, concurrency: int) -> RequestRecord:
        # on the loop that measures the other requests: long streams are built in bulk
        # (llmtop.proxy.chunk_math), as the proxy builds its records
        parser, offsets, status = at.parser, at.offsets, at.status
        # the engine's id: its X-Request-Id, else the one the body named (the parser reads
        # it from the first event now, off the stream's reads)
        upstream_id = at.request_id if at.request_id is not None else parser.response_id
        counts = ChunkCounts(at.counts)
        usage = _count(getattr(parser, "usage_completion_tokens", None))
        prompt = _count(getattr(parser, "usage_prompt_tokens", None))
        model = getattr(parser, "model", None) or self.model
        source: TokenSource
        completion: int | None
        if usage is not None:
            if at.streamed:
                self.rates.learn(model, usage, counts.counted)
            completion, source = usage, "usage"
        elif at.streamed and (estimate := self.rates.estimate(model,
                                                              counts.counted)) is not None:
            # broken off (or stopped) before the engine's usage: the proxy's rule
            completion, source = estimate, "estimate"
        else:
            completion, source = counts.counted or None, "chunks"
        return RequestRecord(
            id=f"bench-{next(_ids)}",
            user=self.user,
            model=model,
            dialect="openai",
            path=urlsplit(self.url()).path,
            stream=at.streamed,
            status=status,
            outcome=outcome,
            t_start=wall,
            ttft_s=(offsets[0] - t0) / 1e9 if offsets else None,
            e2e_s=(end - t0) / 1e9,
            # the engine's count or none: the workload's target is not what the engine read
            # (a chat template adds to it), and a refused request read nothing
            prompt_tokens=prompt,
            completion_tokens=completion,
            token_source=source,
            chunk_offsets_s=seconds_since(t0, offsets),
            chunk_tokens=counts.scaled(None if source == "chunks" else completion),
            concurrency_at_start=concurrency,
            error=error,
            upstream_id=upstream_id,
        )


MAX_COUNT = 2**63 - 1
"""The largest token count believed: the aggregator files counts as int64 (a record with
more is filed nowhere: its level read no requests), and past a float's range every rate
raised OverflowError. An engine's usage beyond it is a bug, taken as no usage."""


def _count(n: int | None) -> int | None:
    return n if n is None or n <= MAX_COUNT else None


def request_id(values: Iterable[str]) -> str | None:
    """The engine's id of a request from its response's ``X-Request-Id`` fields, as the
    proxy takes it (``llmtop.proxy.upstream_head``): the first non-empty one, without its
    spaces, at most 128 characters of safe text; None when there is none."""
    for value in values:
        rid = upstream_id_text(value.strip())
        if rid is not None:
            return rid
    return None


def failure_kind(exc: aiohttp.ClientError) -> str:
    """A short name for why a request got no complete answer, for counting and showing:
    for a connection never made, :func:`llmtop.net_errors.connect_failure_kind`'s."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return connect_failure_kind(exc)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "response cut off"
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE):
        return "connection reset"
    return type(exc).__name__


def error_kind(rec: RequestRecord) -> str:
    """The kind of a failed request's failure: ``HTTP 500``, ``connection refused``,
    ``timeout`` … (the ``error`` text before its first ``": "``)."""
    if rec.outcome == "timeout":
        return "timeout"
    if rec.status >= 400:
        return f"HTTP {rec.status}"
    if rec.error:
        return rec.error.split(": ", 1)[0]
    return rec.outcome


class _Cancelled(asyncio.CancelledError):
    """Cancellation that carries the partial record of the request it interrupted."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__("benchmark stopped")
        self.record = record
