"""The forwarding path: read → timestamp → write → observe, and nothing else.

:class:`RelaySink` moves one response body from the upstream to the client. Each upstream
read is written to the client from the very callback that delivered it — the same bytes,
never re-encoded, never held back, never merged with the next read (chunks out == chunks
in); no task switch, no future, no buffer between the two sockets. Its time is read with
``time.perf_counter_ns()`` just before the write (the write wakes the client, which on a
busy machine may read the chunk before this thread runs again), and after the write the
same immutable ``bytes`` object is fed to the dialect parser. When the parser reports
content in that read, the time and the token count are appended to two lists on the
:class:`Exchange`; the :class:`~llmtop.events.ActiveRequest` is updated in place for live
views. There is no logging, no percentile and no JSON encoding here:
:meth:`Exchange.to_record` builds the one :class:`~llmtop.events.RequestRecord` at the
end, and the server hands it to the bus.

While a stream is open, every :data:`HOLD_AT` chunks or :data:`SLICE_NS` (whichever comes
first) :meth:`Exchange.hold` packs its chunk lists and, when the server gave it ``publish``,
hands the chunks it moved to the bus as one :class:`~llmtop.events.ChunkSlice`: the metrics
file a long answer's ITL and chunk-gap samples while it streams, not all when it ends. The
hot path pays one more integer comparison a chunk for it.

Times follow ``shared/docs/domain.md``: ``t0_ns`` is when the request headers were read;
a content chunk's time is when its bytes were written to the client; E2E ends when the
last byte (the end of the body) was written.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import Callable
from time import perf_counter_ns
from typing import Final, Protocol

from llmtop.events import ActiveRequest, ChunkSlice, Dialect, Outcome, RequestRecord, TokenSource
from llmtop.proxy.chunk_math import BULK, ChunkCounts, seconds_since
from llmtop.proxy.chunk_math import scale_tokens as scale_tokens
from llmtop.proxy.dialects.base import StreamParser
from llmtop.proxy.token_rate import TokenRates

HOLD_AT: Final = 512
"""Chunks an open stream keeps in plain lists before :meth:`Exchange.hold` packs them (and
publishes them as a :class:`~llmtop.events.ChunkSlice`)."""
SLICE_NS: Final = 2_000_000_000
"""…or how long after its first chunk or its last slice (2 s, the metrics' finest interval):
a slow stream's ITL samples reach the windows at most about this late (a stream that stalls
publishes the chunks before the stall with the first chunk after it, or its record)."""
_NEVER: Final = 1 << 62


class ChunkFilter(Protocol):
    """Rewrites the client-bound bytes (the usage-chunk stripper); ``filter`` may return
    ``b""`` when a read held only what the client must not see."""

    extra_fields: bool
    """What was removed held more than the client can do without (see ``usage_extra_fields``)."""

    def filter(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class FlowControlled(Protocol):
    """The client connection's protocol (aiohttp's ``RequestHandler``)."""

    @property
    def writing_paused(self) -> bool: ...


class SliceBus(Protocol):
    """Where an open stream's chunks are published (the server's event bus)."""

    def publish(self, event: ChunkSlice) -> None: ...


class Drainable(Protocol):
    """The client's stream writer: ``drain()`` waits until its transport wants more."""

    async def drain(self) -> None: ...


class Pausable(Protocol):
    """The upstream connection: reading can pause while the client catches up."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class UpstreamBroken(Exception):
    """Reading the upstream body failed after the response had started."""


class Guarded(Protocol):
    """What a :class:`Watchdog` stops when it fires: the request's handler task, or a
    request served from callbacks (:class:`llmtop.proxy.direct.DirectExchange`)."""

    def cancel(self) -> object: ...

    def uncancel(self) -> int: ...


class Watchdog:
    """The upstream first-byte and idle timeouts of one request, checked by a shared
    :class:`WatchdogSweeper`.

    The relay stores the time of each read in :attr:`last_ns` (it takes that reading
    anyway); nothing is scheduled per request or per chunk. When the sweeper finds the
    silence at the limit it cancels the guarded task and :attr:`fired` says why.
    """

    __slots__ = ("_sweeper", "_task", "fired", "last_ns", "limit_ns", "phase")

    def __init__(self, task: Guarded, sweeper: WatchdogSweeper) -> None:
        self._task = task
        self._sweeper = sweeper
        self.limit_ns = 0
        self.last_ns = 0
        self.fired = False
        self.phase = ""

    def arm(self, limit_s: float, phase: str) -> None:
        """Allow ``limit_s`` of silence from now; ``phase`` names it in the error."""
        self.phase = phase
        self.limit_ns = int(limit_s * 1e9)
        self.last_ns = perf_counter_ns()
        self._sweeper.watch(self)

    def fire(self) -> None:
        self.fired = True
        self._sweeper.unwatch(self)
        self._task.cancel()

    def absorb(self) -> None:
        """After catching the cancellation this watchdog caused: undo it on the task."""
        self._task.uncancel()

    def stop(self) -> None:
        self._sweeper.unwatch(self)

    def disown(self) -> None:
        """Stop for good and forget what was guarded (a request served from callbacks
        holds its watchdog: this breaks the reference cycle, so the request is freed as
        soon as it ends rather than at the next full garbage collection)."""
        self.stop()
        self._task = _UNGUARDED


class _Unguarded:
    def cancel(self) -> bool:
        return False

    def uncancel(self) -> int:
        return 0


_UNGUARDED = _Unguarded()


class WatchdogSweeper:
    """Checks every armed :class:`Watchdog` each ``interval_s`` (one timer for the whole
    proxy, however many streams are open); a timeout fires at most one interval late."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._armed: set[Watchdog] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, wd: Watchdog) -> None:
        self._armed.add(wd)

    def unwatch(self, wd: Watchdog) -> None:
        self._armed.discard(wd)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sweep()

    def sweep(self) -> None:
        now = perf_counter_ns()
        late = [wd for wd in self._armed if now - wd.last_ns >= wd.limit_ns]
        for wd in late:
            wd.fire()


class Exchange:
    """What the proxy learns about one request while relaying it."""

    __slots__ = (
        "active",
        "end_ns",
        "error",
        "headers_sent",
        "held_offsets",
        "held_tokens",
        "measured",
        "model",
        "offsets",
        "outcome",
        "parser",
        "prompt_list",
        "prompt_tokens",
        "slice_due",
        "slices",
        "status",
        "stream",
        "tokens",
    )

    def __init__(self, active: ActiveRequest) -> None:
        self.active = active
        self.offsets: list[int] = []
        """perf_counter_ns of each content chunk's write (the latest, up to
        :data:`HOLD_AT`; the earlier ones in ``held_offsets``)."""
        self.tokens: list[int] = []
        """Tokens the parser counted in each content chunk (as ``offsets``)."""
        self.held_offsets: array[int] | None = None
        self.held_tokens: array[int] | None = None
        self.status = 0
        self.outcome: Outcome = "ok"
        self.error: str | None = None
        self.end_ns = 0
        self.headers_sent = False
        self.parser: StreamParser | None = None
        self.model: str | None = None
        self.stream = False
        self.prompt_tokens: int | None = None
        self.prompt_list: tuple[int, int] | None = None
        """The request held a list of prompts: how many, and the choices asked for each
        (``RequestInfo.prompts``, ``n``); None: one prompt."""
        self.measured = True
        """A generation request: in the live views and published as a record (a GET for
        a model list, a health check or ``/metrics`` is forwarded but not measured)."""
        self.slices: SliceBus | None = None
        """Where :meth:`hold` publishes a streamed answer's chunks while it is open (the
        server's bus, kept rather than its bound ``publish``: one object fewer for the
        garbage collector per open request); None: nowhere (the record alone carries
        them)."""
        self.slice_due = _NEVER
        """``perf_counter_ns`` from which the next content chunk makes :meth:`hold` run
        (set at the first chunk and at each slice when ``slices`` is set)."""

    def hold(self) -> None:
        """Move the chunk lists into packed arrays (called every :data:`HOLD_AT` chunks,
        and at the first chunk :data:`SLICE_NS` after the last call when ``publish`` is
        set). A list holds a chunk's time as an int object and a pointer, ~48 bytes with
        its token count; packed it is 16 — a 16k-token reasoning answer holds 260 KB open,
        not 780 KB. A list is appended to ~5× faster than an array, so the hot path
        appends to the lists and this moves them once in a while.

        A streamed, measured answer's moved chunks are then published as a
        :class:`~llmtop.events.ChunkSlice` (tokens as the parser counted them; the record
        at the end scales them to the engine's usage)."""
        offs, toks = self.offsets, self.tokens
        held = self.held_offsets
        if held is None:
            held = self.held_offsets = array("q")
            self.held_tokens = array("q")
        assert self.held_tokens is not None
        first = len(held)
        prev = held[-1] if first else None
        held.extend(offs)
        self.held_tokens.extend(toks)
        self.offsets = []
        self.tokens = []
        bus = self.slices
        if bus is not None and offs and self.stream and self.measured:
            last = offs[-1]
            self.slice_due = last + SLICE_NS
            a = self.active
            parser = self.parser
            model = (parser.model if parser is not None else None) or self.model or a.model
            bus.publish(ChunkSlice(a.id, a.user, model, a.t_start + (last - a.t0_ns) / 1e9,
                                   a.t0_ns, first, prev, tuple(offs), tuple(toks)))

    def fail(self, outcome: Outcome, error: str) -> None:
        """Set the outcome unless an earlier failure already explains the request.

        A client that leaves once it has read the stream's end marker (``[DONE]``, …) got
        the whole answer: that is not a cancellation. (The sync openai SDK closes the
        connection right after ``[DONE]``, racing the chunked terminator's write: QA saw
        2–40% of complete streams recorded ``cancelled``.) The end marker was fed to the
        parser only after its bytes were written to an open client connection."""
        if self.outcome == "ok":
            if outcome == "cancelled" and self.parser is not None and self.parser.ended:
                return
            self.outcome = outcome
            self.error = error

    def to_record(self, rates: TokenRates | None = None) -> RequestRecord:
        """The one finished-request event (token counts scaled to the engine's usage).

        With ``rates`` (the proxy's :class:`~llmtop.proxy.token_rate.TokenRates`): a stream
        with usage teaches its model's tokens per counted token, and a stream without usage
        is scaled by the rate learned (``token_source`` ``estimate``) when the model has one
        other than 1; else it stays counted one token per content event (``chunks``)."""
        a = self.active
        t0 = a.t0_ns
        end = self.end_ns or perf_counter_ns()
        parser = self.parser
        usage: int | None = None
        prompt = self.prompt_tokens
        model = self.model or a.model
        upstream_id = a.upstream_id  # the response's X-Request-Id, before the body's id
        if parser is not None:
            usage = parser.usage_completion_tokens
            if parser.usage_prompt_tokens is not None:
                prompt = parser.usage_prompt_tokens
            model = parser.model or model
            if upstream_id is None:
                upstream_id = parser.response_id
        held = self.held_offsets
        toks = self.tokens
        # a short stream (all its chunks still in the two lists): its figures in plain
        # Python, without ChunkCounts' parts (what it gives for these lists, the same types)
        short = held is None and len(toks) < BULK
        counts = None if short else ChunkCounts(self.held_tokens, toks)
        counted = sum(toks) if counts is None else counts.counted
        source: TokenSource
        completion: int | None
        if usage is not None:
            if rates is not None and self.stream:
                rates.learn(model, usage, counted)
            completion = usage
            source = "usage"
        elif rates is not None and self.stream and (
                estimate := rates.estimate(model, counted)) is not None:
            # ended before the engine's usage (cancelled, broken off, not asked for)
            completion = estimate
            source = "estimate"
        else:
            completion = counted if counted > 0 else None  # e.g. ``other``: nothing counted
            source = "chunks"
        offsets = self.offsets
        first = held[0] if held else offsets[0] if offsets else None
        dialect: Dialect = a.dialect
        if counts is None:
            offsets_s = tuple([(o - t0) / 1e9 for o in offsets])
            total = None if source == "chunks" else completion
            chunk_tokens = (tuple(toks) if total is None or total == counted
                            else tuple(scale_tokens(toks, total)))
        else:
            offsets_s = seconds_since(t0, held, offsets)
            chunk_tokens = counts.scaled(None if source == "chunks" else completion)
        return RequestRecord(
            id=a.id,
            user=a.user,
            model=model,
            dialect=dialect,
            path=a.path,
            stream=self.stream,
            status=self.status,
            outcome=self.outcome,
            t_start=a.t_start,
            ttft_s=(first - t0) / 1e9 if first is not None else None,
            e2e_s=(end - t0) / 1e9,
            prompt_tokens=prompt,
            completion_tokens=completion,
            token_source=source,
            chunk_offsets_s=offsets_s,
            chunk_tokens=chunk_tokens,
            concurrency_at_start=a.concurrency_at_start,
            error=self.error,
            upstream_id=upstream_id,
        )


SHUTDOWN_REASON = "proxy shut down"
"""The ``error`` of a request cancelled at the shutdown deadline."""
CLIENT_STALL: Final = "client"
"""A :class:`Watchdog`'s phase while the relay waits for the client to read (reading the
upstream paused for it)."""


def close_then_drop(transport: asyncio.BaseTransport, grace_s: float) -> None:
    """Close a client's connection once what it was sent has gone out, as a truncated
    response ends; a client that has not taken it all ``grace_s`` later is dropped then,
    with the rest. (A graceful close alone waits for a client that does not read for as
    long as it keeps its end open, holding the connection and the bytes.)"""
    transport.close()
    if isinstance(transport, asyncio.WriteTransport) and transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(grace_s, transport.abort)


def cut_off(wd: Watchdog, client: asyncio.Transport | None, sink: RelaySink | None = None
            ) -> tuple[Outcome, str]:
    """End a response its watchdog ``wd`` cut off after it had started, on the client's
    transport: returns its outcome and ``error``. The upstream was silent for the idle
    limit (``timeout``): the client's connection closes once what it was sent has gone out,
    so it reads a truncated response (with what ``sink`` still held back of the upstream's
    bytes: :meth:`RelaySink.release_held`). Or the client read nothing for as long while the
    upstream waited on it (``cancelled``: the client went away in all but name — nginx's
    ``send_timeout``): its connection is dropped at once, with the bytes it did not take
    (a graceful close would wait for a client that does not read, holding its connection
    and those bytes for as long as it keeps its end open; after a ``timeout`` such a
    client has the idle limit again to read: :func:`close_then_drop`)."""
    limit = f"{wd.limit_ns / 1e9:g} s"
    if wd.phase == CLIENT_STALL:
        if client is not None:
            client.abort()
        return "cancelled", f"client stopped reading for {limit}"
    if client is not None:
        if sink is not None:
            sink.release_held()
        close_then_drop(client, wd.limit_ns / 1e9)
    return "timeout", f"upstream idle for {limit} mid-response"


class ClientGone(ConnectionError):
    """The client's connection closed while its response was being relayed."""


class _Open:
    """The outcome of a relay still open (None is the body in full)."""


_OPEN = _Open()


def _resolve(fut: asyncio.Future[None], outcome: BaseException | None) -> None:
    """Resolve a relay's ``done`` with how it ended (None: the body in full)."""
    if outcome is None:
        fut.set_result(None)
    else:
        fut.set_exception(outcome)


class RelayListener(Protocol):
    """Told how a relay ended, a loop turn after it did (:meth:`RelaySink.listen`)."""

    def relay_ended(self, exc: BaseException | None) -> None: ...


class RelaySink:
    """The forwarding path for one response body (see the module docstring).

    The upstream connection calls :meth:`on_data` from its ``data_received`` with the body
    bytes of each network read; they are written to the client's transport in the same
    callback — framed as an HTTP chunk when the response to the client is chunked, as is
    otherwise — timestamped just before that write and fed to the parser after it. The
    response head (``head``) goes out with the first write, or on its own from
    :meth:`send_head` when no body bytes came with it; the end of the body (the chunked
    terminator) with the last bytes when the upstream's end came in the same read, else on
    its own from :meth:`on_end`. When the
    client reads slower than the upstream writes (its transport's buffer passes the
    high-water mark), reading from the upstream pauses until the client has drained:
    nothing piles up in the proxy. :attr:`done` resolves at the end of the body (the
    exchange's ``end_ns`` is then the time its last byte was written), or with
    :class:`UpstreamBroken` / :class:`ClientGone`; a listener (:meth:`listen`) is told the
    same (None or the exception) a loop turn later, as a future's callback would be, without
    a future. ``on_complete`` is called once, just before the end of the body is written to
    an open transport (the request is then over for the proxy and the upstream connection
    free for the next request, before the handler wakes up; see :meth:`_complete`);
    :attr:`completed` says it was.

    A relay keeps few objects for the garbage collector while it is open (its collections
    stop the forwarding loop and walk every open request's objects): :attr:`done` is made
    only when asked for, and the parser is kept rather than its bound ``feed``.
    """

    __slots__ = ("_chunked", "_client", "_done", "_drainer", "_ex", "_head", "_listener",
                 "_loop", "_on_complete", "_outcome", "_parser", "_strip", "_transport",
                 "_upstream", "_wd", "_writer", "completed", "last_ns")

    def __init__(
        self,
        ex: Exchange,
        parser: StreamParser,
        strip: ChunkFilter | None,
        transport: asyncio.Transport,
        head: bytes,
        chunked: bool,
        client_protocol: FlowControlled,
        writer: Drainable,
        upstream: Pausable,
        wd: Watchdog,
        loop: asyncio.AbstractEventLoop,
        on_complete: Callable[[], None] | None = None,
    ) -> None:
        self._ex = ex
        self._on_complete = on_complete
        self.completed = False
        self._parser = parser
        self._strip = strip
        self._transport = transport
        self._head = head
        self._chunked = chunked
        self._client = client_protocol
        self._writer = writer
        self._upstream = upstream
        self._wd = wd
        self._drainer: asyncio.Task[None] | None = None
        self._loop = loop
        self._done: asyncio.Future[None] | None = None
        self._outcome: BaseException | _Open | None = _OPEN
        """How the relay ended (None: the body in full), or :data:`_OPEN`."""
        self._listener: RelayListener | None = None
        self.last_ns = perf_counter_ns()

    @property
    def done(self) -> asyncio.Future[None]:
        """Resolves at the end of the body, or with why the relay ended early (made at the
        first call: a listener needs none)."""
        fut = self._done
        if fut is None:
            fut = self._done = self._loop.create_future()
            outcome = self._outcome
            if not isinstance(outcome, _Open):
                _resolve(fut, outcome)
        return fut

    def listen(self, listener: RelayListener) -> None:
        """Tell ``listener`` how the relay ends, a loop turn after it does (at once — a loop
        turn from now — if it has ended already)."""
        self._listener = listener
        outcome = self._outcome
        if not isinstance(outcome, _Open):
            self._loop.call_soon(listener.relay_ended, outcome)

    @property
    def settled(self) -> bool:
        """The relay has ended (the body in full or not), or its :attr:`done` was
        cancelled (its awaiting handler was): nothing more is written."""
        fut = self._done
        return self._outcome is not _OPEN or (fut is not None and fut.done())

    def _write(self, data: bytes, end: bool = False) -> bool:
        t = self._transport
        if t.is_closing():
            self._settle(ClientGone("client disconnected"))
            return False
        if self._chunked:
            if data:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if end:
                data += b"0\r\n\r\n"
        if self._head:
            data = self._head + data
            self._head = b""
        if data:
            t.write(data)
        if t.get_write_buffer_size() and self._client.writing_paused:
            self._pause_upstream()
        return True

    def _pause_upstream(self) -> None:
        """The client's transport is over its high-water mark: stop reading the upstream
        until it has drained. Meanwhile the upstream is not idle, the client is: the
        watchdog's silence is the client's (:data:`CLIENT_STALL`) until it drains."""
        if self._drainer is None:
            self._upstream.pause_reading()
            self._wd.phase = CLIENT_STALL
            self._drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:
            self._settle(ClientGone("client disconnected"))
            return
        finally:
            self._drainer = None
        wd = self._wd
        if wd.phase == CLIENT_STALL:  # the upstream's silence counts from now
            wd.phase = "idle"
            wd.last_ns = perf_counter_ns()
        self._upstream.resume_reading()

    def send_head(self) -> None:
        """Write the response head now unless it went out already (with body bytes)."""
        if self._head and not self.settled:
            self._write(b"")

    def on_data(self, data: bytes, frame: bytes | None = None) -> None:
        # the hot path, once per upstream read: _write and _chunk inlined. ``frame``: the
        # upstream's own chunks holding ``data`` (see BodySink.on_data): a chunked client is
        # sent them as they are when nothing was removed from ``data``, not a copy framed anew
        fut = self._done
        if self._outcome is not _OPEN or (fut is not None and fut.done()):
            return
        strip = self._strip
        out = data if strip is None else strip.filter(data)
        # the chunk's time is taken as it is written, just before the write: the write wakes
        # the client, which on a busy machine can read the chunk before this thread is back
        now = perf_counter_ns()
        if out:
            t = self._transport
            if t.is_closing():
                self._settle(ClientGone("client disconnected"))
                return
            if self._chunked:
                out = (frame if frame is not None and out is data
                       else b"%x\r\n%b\r\n" % (len(out), out))
            if self._head:
                out = self._head + out
                self._head = b""
            t.write(out)
            # a transport that sent everything at once cannot have paused its protocol
            if t.get_write_buffer_size() and self._client.writing_paused:
                self._pause_upstream()
        self.last_ns = now
        self._wd.last_ns = now
        events, toks = self._parser.feed(data)
        if events:
            ex = self._ex
            active = ex.active
            if active.first_token_ns is None:
                active.first_token_ns = now
                if ex.slices is not None:
                    ex.slice_due = now + SLICE_NS
                # (once a request) the live row goes by the model the answer names, as the
                # chunk slices and the record do: gpt-4o is answered as gpt-4o-2024-08-06
                answered = self._parser.model
                if answered is not None:
                    active.model = answered
            active.last_chunk_ns = now
            active.chunks += 1
            active.tokens += toks
            ex.offsets.append(now)
            ex.tokens.append(toks)
            if now >= ex.slice_due or len(ex.tokens) >= HOLD_AT:
                ex.hold()

    def _chunk(self, now: int, toks: int) -> None:
        ex = self._ex
        active = ex.active
        if active.first_token_ns is None:
            active.first_token_ns = now
        active.last_chunk_ns = now
        active.chunks += 1
        active.tokens += toks
        ex.offsets.append(now)
        ex.tokens.append(toks)
        if len(ex.tokens) >= HOLD_AT:
            ex.hold()

    def on_last(self, data: bytes) -> None:
        """``on_data(data)`` and ``on_end()`` with one write to the client."""
        if self.settled:
            return
        strip = self._strip
        out = data if strip is None else strip.filter(data) + strip.flush()
        now = perf_counter_ns()
        if self._transport.is_closing():
            self._settle(ClientGone("client disconnected"))
            return
        self.last_ns = now
        self._wd.last_ns = now
        self._ex.end_ns = now
        self._complete()  # (before the write: see _complete)
        self._write(out, end=True)
        events, toks = self._parser.feed(data)
        if events:
            self._chunk(now, toks)
        self._settle(None)

    def _complete(self) -> None:
        """The end of the body is being written (the transport is open): the request is
        over for the proxy. Called just before that write, not after it: the client can
        read the end and open its next request before this process runs again, and that
        request's ``concurrency_at_start`` must not count this one (CI saw a probe count
        one too many, between two worker processes on a busy machine)."""
        self.completed = True
        if self._on_complete is not None:
            self._on_complete()

    def on_end(self) -> None:
        if self.settled:
            return
        tail = self._strip.flush() if self._strip is not None else b""
        now = perf_counter_ns()
        write = bool(tail or self._chunked or self._head)
        if write and self._transport.is_closing():
            self._settle(ClientGone("client disconnected"))
            return
        if tail:
            self.last_ns = now
        self._ex.end_ns = now
        self._complete()  # (before the write: see _complete)
        if write:
            self._write(tail, end=True)
        self._settle(None)

    def on_error(self, exc: Exception) -> None:
        if not self.settled:
            self.release_held()
        self._settle(UpstreamBroken(f"upstream stream broke: {exc}"))

    def release_held(self) -> None:
        """The upstream's body ended early (its connection broke, or it fell silent and was
        cut off): write what the usage stripper still holds back — the start of an event
        whose end never came, a llama.cpp finish event awaiting the next — so the client's
        truncated response holds every byte the upstream sent, in order, as at a clean end
        (``flush``: only a whole usage event is still left out). Not before the head went
        out (the caller answers a whole 502 then), nor to a closing transport; the end of
        the body is not written (the response stays truncated)."""
        strip = self._strip
        if strip is None or self._head:
            return
        tail = strip.flush()
        t = self._transport
        if tail and not t.is_closing():
            t.write(b"%x\r\n%b\r\n" % (len(tail), tail) if self._chunked else tail)

    def _settle(self, exc: BaseException | None) -> None:
        if self.settled:
            return
        self._outcome = exc
        if self._done is not None:
            _resolve(self._done, exc)
        listener = self._listener
        if listener is not None:
            self._loop.call_soon(listener.relay_ended, exc)

    @property
    def head_sent(self) -> bool:
        """The response head has gone to the client (an error before it can still be
        answered with a whole error response)."""
        return not self._head

    @property
    def usage_extra_fields(self) -> bool:
        """The usage event removed from this stream held more than usage (see
        :class:`~llmtop.proxy.dialects.openai_usage.UsageChunkStripper`)."""
        strip = self._strip
        return strip is not None and strip.extra_fields

    @property
    def parser_error(self) -> str | None:
        """What the dialect parser found wrong with the stream (None: nothing)."""
        return self._parser.error

    def finish(self) -> None:
        """After the end of the body was written: a last event that had no trailing blank
        line/newline was written with the last read, so it counts at that time."""
        events, toks = self._parser.finish()
        if events:
            self._chunk(self.last_ns, toks)

    def cancel(self) -> None:
        """Stop: no more writes (the relay is being torn down)."""
        self._settle(ClientGone("relay cancelled"))
        if self._drainer is not None:
            self._drainer.cancel()
