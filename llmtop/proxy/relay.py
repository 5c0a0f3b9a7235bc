"""The forwarding path: read → write → timestamp → observe, and nothing else.

:func:`pump` moves one response body from the upstream to the client. Each read is written
to the client as soon as it arrives — the same bytes, never re-encoded, never held back,
never merged with the next read (chunks out == chunks in) — and only then timestamped with
``time.perf_counter_ns()`` and fed, as the same immutable ``bytes`` object, to the dialect
parser. When the parser reports content in that read, the time and the token count are
appended to two lists on the :class:`Exchange`; the :class:`~llmtop.events.ActiveRequest`
is updated in place for live views. There is no logging, no percentile and no JSON
encoding here: :meth:`Exchange.to_record` builds the one
:class:`~llmtop.events.RequestRecord` at the end, and the server hands it to the bus.

Times follow ``shared/docs/domain.md``: ``t0_ns`` is when the request headers were read;
a content chunk's time is when its bytes were written to the client; E2E ends when the
last byte (the end of the body) was written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import perf_counter_ns
from typing import Protocol

from aiohttp import ClientError

from llmtop.events import ActiveRequest, Dialect, Outcome, RequestRecord, TokenSource
from llmtop.proxy.dialects.base import StreamParser

ReadFn = Callable[[], Awaitable[bytes]]
WriteFn = Callable[[bytes], Awaitable[None]]


class ChunkFilter(Protocol):
    """Rewrites the client-bound bytes (the usage-chunk stripper); ``filter`` may return
    ``b""`` when a read held only what the client must not see."""

    def filter(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class UpstreamBroken(Exception):
    """Reading the upstream body failed after the response had started."""


class Watchdog:
    """The upstream first-byte and idle timeouts with one timer per request.

    The relay stores the time of each read in :attr:`last_ns` (it takes that reading
    anyway); the timer only looks at it when it fires and re-arms itself for the rest of
    the allowed silence, so a busy stream costs no timer work per chunk. When the silence
    reaches the limit the guarded task is cancelled and :attr:`fired` says why.
    """

    __slots__ = ("_handle", "_loop", "_task", "fired", "last_ns", "limit_ns", "phase")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self._loop = task.get_loop()
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self.limit_ns = 0
        self.last_ns = 0
        self.fired = False
        self.phase = ""

    def arm(self, limit_s: float, phase: str) -> None:
        """Allow ``limit_s`` of silence from now; ``phase`` names it in the error."""
        self.stop()
        self.phase = phase
        self.limit_ns = int(limit_s * 1e9)
        self.last_ns = perf_counter_ns()
        self._handle = self._loop.call_later(limit_s, self._check)

    def _check(self) -> None:
        self._handle = None
        quiet = perf_counter_ns() - self.last_ns
        if quiet >= self.limit_ns:
            self.fired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_later((self.limit_ns - quiet) / 1e9, self._check)

    def absorb(self) -> None:
        """After catching the cancellation this watchdog caused: undo it on the task."""
        self._task.uncancel()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Exchange:
    """What the proxy learns about one request while relaying it."""

    __slots__ = (
        "active",
        "end_ns",
        "error",
        "headers_sent",
        "model",
        "offsets",
        "outcome",
        "parser",
        "prompt_tokens",
        "status",
        "stream",
        "tokens",
    )

    def __init__(self, active: ActiveRequest) -> None:
        self.active = active
        self.offsets: list[int] = []
        """perf_counter_ns of each content chunk's write."""
        self.tokens: list[int] = []
        """Tokens the parser counted in each content chunk."""
        self.status = 0
        self.outcome: Outcome = "ok"
        self.error: str | None = None
        self.end_ns = 0
        self.headers_sent = False
        self.parser: StreamParser | None = None
        self.model: str | None = None
        self.stream = False
        self.prompt_tokens: int | None = None

    def fail(self, outcome: Outcome, error: str) -> None:
        """Set the outcome unless an earlier failure already explains the request."""
        if self.outcome == "ok":
            self.outcome = outcome
            self.error = error

    def to_record(self) -> RequestRecord:
        """The one finished-request event (token counts scaled to the engine's usage)."""
        a = self.active
        t0 = a.t0_ns
        end = self.end_ns or perf_counter_ns()
        parser = self.parser
        usage: int | None = None
        prompt = self.prompt_tokens
        model = self.model or a.model
        if parser is not None:
            usage = parser.usage_completion_tokens
            if parser.usage_prompt_tokens is not None:
                prompt = parser.usage_prompt_tokens
            model = parser.model or model
        counts = self.tokens
        source: TokenSource
        if usage is not None:
            counts = scale_tokens(counts, usage)
            completion: int | None = usage
            source = "usage"
        else:
            counted = sum(counts)
            completion = counted if counted > 0 else None  # e.g. ``other``: nothing counted
            source = "chunks"
        offsets = self.offsets
        dialect: Dialect = a.dialect
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
            ttft_s=(offsets[0] - t0) / 1e9 if offsets else None,
            e2e_s=(end - t0) / 1e9,
            prompt_tokens=prompt,
            completion_tokens=completion,
            token_source=source,
            chunk_offsets_s=tuple((o - t0) / 1e9 for o in offsets),
            chunk_tokens=tuple(counts),
            concurrency_at_start=a.concurrency_at_start,
            error=self.error,
        )


def scale_tokens(counts: list[int], total: int) -> list[int]:
    """Per-chunk token counts scaled so they sum to ``total`` (largest remainder; ties go
    to the earlier chunk). Chunks that counted nothing share evenly when all did."""
    n = len(counts)
    if n == 0:
        return []
    total = max(total, 0)
    have = sum(counts)
    if have == total:
        return list(counts)
    weights = counts if have > 0 else [1] * n
    wsum = have if have > 0 else n
    base = [w * total // wsum for w in weights]
    left = total - sum(base)
    if left:
        order = sorted(range(n), key=lambda i: (-(weights[i] * total % wsum), i))
        for i in order[:left]:
            base[i] += 1
    return base


async def pump(
    read: ReadFn,
    write: WriteFn,
    write_eof: Callable[[], Awaitable[None]],
    parser: StreamParser,
    ex: Exchange,
    wd: Watchdog,
    strip: ChunkFilter | None = None,
) -> None:
    """Relay one response body (see the module docstring).

    Raises :class:`UpstreamBroken` when the upstream read fails, ``ConnectionError`` when
    the client is gone, ``CancelledError`` on cancellation (client left, timeout,
    shutdown). ``ex.end_ns`` is set once the end of the body has been written.
    """
    active = ex.active
    add_offset = ex.offsets.append
    add_tokens = ex.tokens.append
    feed = parser.feed
    clock = perf_counter_ns
    last = clock()
    while True:
        try:
            data = await read()
        except ClientError as exc:
            raise UpstreamBroken(f"upstream stream broke: {type(exc).__name__}: {exc}") from exc
        if not data:
            break
        if strip is None:
            await write(data)
        else:
            kept = strip.filter(data)
            if kept:
                await write(kept)
        last = clock()
        wd.last_ns = last
        events, toks = feed(data)
        if events:
            if active.first_token_ns is None:
                active.first_token_ns = last
            active.last_chunk_ns = last
            active.chunks += 1
            active.tokens += toks
            add_offset(last)
            add_tokens(toks)
    if strip is not None:
        tail = strip.flush()
        if tail:
            await write(tail)
            last = clock()
    await write_eof()
    ex.end_ns = clock()
    # A last event without its trailing blank line/newline was written with the last read.
    events, toks = parser.finish()
    if events:
        if active.first_token_ns is None:
            active.first_token_ns = last
        active.last_chunk_ns = last
        active.chunks += 1
        active.tokens += toks
        add_offset(last)
        add_tokens(toks)
