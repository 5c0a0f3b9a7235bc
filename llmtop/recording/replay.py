"""Replaying a recording through the live aggregation code on a virtual clock.

:class:`ReplayEngine` reads a recording (streaming, with a bounded read-ahead) and plays it
into :class:`llmtop.metrics.aggregator.Aggregator` exactly as a proxy would have: request
records are delivered when they *finished* (``t_start + e2e_s``), readings and warnings at
their ``t``, in batches that never cross a tick; every ``tick_s`` of virtual time the
aggregator is ticked. Between start and finish each request sits in a synthesized active
registry (``ActiveRequest``: waiting until its first chunk, then streaming, with its tokens
so far from its chunk offsets), so in-flight, waiting/streaming, live TPS and the active
requests table come out as they did live. Snapshots therefore come from the same code as
live ones — never from a second percentile engine.

Read-ahead: a request only becomes known when its record is read, which is when it
finished. The engine reads ``lookahead_s`` of recording time ahead of the clock (bounded by
``max_buffered`` events), so a request longer than that is started late: its tokens up to
the clock land in one tick (a 15-minute answer read 600 s ahead showed as a burst of tok/s).
The read-ahead grows to the longest request read so far (+ ``LOOKAHEAD_MARGIN_S``), so only
the first such requests are late; ``late_starts`` counts them and ``max_e2e_s`` says what
read-ahead would have avoided them — the report replays again with it. Seeking backwards
restarts from the beginning of the file (keeping the grown read-ahead).

The clock starts at the recording's ``started_at`` (``begin``): a recording started
mid-traffic (with ``POST /llmtop/v1/recording``), or a rotated part read alone, holds
requests that began before it. They are carried in — open at the start, with what they
streamed before it told to the aggregator (:meth:`Aggregator.carry_in`), which never counts
it — so every rate is over the recording's span and the tokens inside it (starting at the
first request's start instead, over all its tokens, a span missing the requests that ended
before the recording began read 234 tok/s for 199).
The records read ahead are held packed (:mod:`llmtop.packed`: their chunk lists
as packed numbers, about 8 bytes a chunk instead of 40) and unpacked, equal to what was
read, when they are delivered.

:class:`ReplaySource` wraps an engine as the TUI's ``SnapshotSource`` + ``ReplayControl``
(pause, resume, seek, speed), driven by the wall clock times ``speed``.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from llmtop.config import Config, SloConfig
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.slo import Slo
from llmtop.packed import HeldRecord, pack
from llmtop.recording.errors import RecordingError
from llmtop.recording.parts import Series, Source, open_recording, source_path
from llmtop.recording.reader import (
    Progress,
    decode_event,
    event_time,
    loads_line,
)
from llmtop.recording.validate import MAX_GAP_S

__all__ = ["DEFAULT_LOOKAHEAD_S", "IDLE_SKIP_S", "ReplayEngine", "ReplaySource", "config_for",
           "event_time"]

_START, _EVENT = 0, 1
DEFAULT_LOOKAHEAD_S: Final = 600.0
LOOKAHEAD_MARGIN_S: Final = 30.0
"""Read-ahead kept beyond the longest request read so far (see ``late_starts``)."""
EARLY_EVENT_S: Final = 60.0
"""A first event this much before the header's ``started_at`` (by its time: a request's
end) says the header's clock is off, not that the event reached the recorder a moment
late: the replay then starts at the first event instead."""
IDLE_SKIP_S: Final = 86400.0
"""A stretch longer than this with nothing in flight and nothing to deliver is crossed in one
step instead of tick by tick (its concurrency samples, all zero, are not taken)."""


def config_for(header: Mapping[str, Any], slo: Mapping[str, Any] | None = None,
               *, top_users: int = 20) -> Config:
    """A Config carrying the recording's SLOs (objectives absent from the header are unset,
    not the defaults), optionally overridden by ``slo`` (same keys)."""
    raw = dict(header.get("slo") or {}) if isinstance(header.get("slo"), dict) else {}
    if slo:
        raw.update(slo)  # a None value unsets an objective
    s = Slo.from_dict(raw)
    cfg = Config()
    cfg.upstream = str(header.get("upstream") or "")
    cfg.top_users = top_users
    cfg.slo = SloConfig(ttft_s=s.ttft_s, itl_p95_s=s.itl_p95_s, tpot_s=s.tpot_s,
                        e2e_s=s.e2e_s, target=s.target)
    return cfg


@dataclass(slots=True)
class _Live:
    """A request in flight in the replay: when it started, its chunk offsets, its tokens
    up to each chunk (None: one a chunk), where its stream has got to, and the status,
    prompt size and engine's id its row shows once its first chunk has gone out."""

    t_start: float
    offsets: Sequence[float]
    cum_tokens: array[int] | list[int] | None
    active: ActiveRequest
    status: int
    prompt_tokens: int | None
    upstream_id: str | None = None


def _to_chunk(lv: _Live, k: int) -> None:
    """Move ``lv``'s row to its first ``k`` chunks out."""
    a, offs, cum = lv.active, lv.offsets, lv.cum_tokens
    a.chunks = k
    if k:
        # the head went out before the first chunk: the row has its status from there, as
        # a live one does; the recording does not say when the engine told the prompt's
        # size (at the start or with the last chunk), so the row shows it from the first
        # chunk too
        a.status = lv.status
        a.prompt_tokens = lv.prompt_tokens
        a.upstream_id = lv.upstream_id
        a.first_token_ns = a.t0_ns + round(offs[0] * 1e9)
        a.last_chunk_ns = a.t0_ns + round(offs[k - 1] * 1e9)
        a.tokens = cum[k - 1] if cum is not None and k <= len(cum) else k


class ReplayEngine:
    """Plays one recording into an Aggregator. ``advance_to(t)`` moves the virtual clock.

    ``observer`` (optional) sees every event once, in file order, as it is read — the
    report uses it for what the aggregator does not keep (conditions, readings over time).
    """

    def __init__(
        self,
        path: Source,
        *,
        slo: Mapping[str, Any] | None = None,
        tick_s: float = 0.5,
        lookahead_s: float = DEFAULT_LOOKAHEAD_S,
        max_buffered: int = 200_000,
        top_users: int = 20,
        progress: Progress | None = None,
        observer: Callable[[Event], None] | None = None,
    ) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be positive")
        self.path = source_path(path)
        self.tick_s = tick_s
        self.lookahead_s = lookahead_s
        self.max_buffered = max_buffered
        self.observer = observer
        self.reader = open_recording(path, progress=progress)
        self.header = self.reader.header
        self.cfg = config_for(self.header, slo, top_users=top_users)
        self._events: Iterator[Event] = iter(self.reader)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._read_to = -math.inf  # event time of the latest event read
        self.exhausted = False
        self.idle_skipped_s = 0.0
        """Virtual seconds crossed in one step (idle stretches over ``IDLE_SKIP_S``)."""
        self.max_e2e_s = 0.0
        """The longest request read so far (seconds from its start to its end)."""
        self.late_starts = 0
        """Requests started after the clock had passed their start by more than a tick
        (read too late: see the module docstring)."""
        self.last_event_t: float | None = None
        self.first_event_t: float | None = None
        self.events_delivered = 0
        self._live: dict[str, _Live] = {}
        self.active: dict[str, ActiveRequest] = {}
        self._fill(-math.inf, want_one=True)
        started = self.header.get("started_at")
        begin = float(started) if isinstance(started, int | float) else None
        first = self._heap[0][0] if self._heap else None  # (a request's start)
        first_t = self._read_to if self._heap else None  # (its end: when it was written)
        if begin is None or (first_t is not None
                             and not begin - EARLY_EVENT_S <= first_t <= begin + MAX_GAP_S):
            # no start, a first event well before it, or none for a day after it (a clock
            # step or a damaged header: a report spanned a year of empty seconds, 830 MB)
            begin = first if first is not None else time.time()
        elif first_t is not None and first_t < begin:
            # an event stamped a moment before the recorder started and handed to it
            # after (a reading; a request that ended as it started): the span holds it
            begin = first_t
        self.begin: float = begin
        """Where the replay's clock and the aggregator start: the header's ``started_at``
        (or the first event's time when that is a moment earlier) — the recording's span,
        every rate's; requests begun before it are carried in (:meth:`_start`) — or the
        first request's start when the header has no start to trust."""
        self.now: float = begin
        self.aggregator = Aggregator(self.cfg, self.active, clock=self._clock,
                                     upstream=self.cfg.upstream)
        self._next_tick = math.floor(begin / tick_s) * tick_s + tick_s

    def _clock(self) -> float:
        return self.now

    def close(self) -> None:
        self.reader.close()

    # -- reading ahead ---------------------------------------------------------------------

    def _push(self, t: float, kind: int, item: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, item))

    def _fill(self, horizon: float, *, want_one: bool = False) -> None:
        """Read events until the file is ``lookahead_s`` past ``horizon`` (or the buffer is
        full, or the file ends)."""
        limit = horizon + self.lookahead_s
        while not self.exhausted and (
            (want_one and not self._heap)
            or (self._read_to <= limit and len(self._heap) < self.max_buffered)
        ):
            try:
                ev = next(self._events)
            except StopIteration:
                self.exhausted = True
                break
            if self.observer is not None:
                self.observer(ev)
            t = event_time(ev)
            if self.first_event_t is None or t < self.first_event_t:
                self.first_event_t = t
            self._read_to = max(self._read_to, t)
            self.last_event_t = self._read_to
            if isinstance(ev, RequestRecord):
                if ev.e2e_s > self.max_e2e_s and math.isfinite(ev.e2e_s):
                    self.max_e2e_s = ev.e2e_s
                    if ev.e2e_s + LOOKAHEAD_MARGIN_S > self.lookahead_s:
                        self.lookahead_s = ev.e2e_s + LOOKAHEAD_MARGIN_S
                        limit = horizon + self.lookahead_s
                held = pack(ev)  # what the read-ahead holds until the request ends
                self._push(ev.t_start, _START, held)
                self._push(t, _EVENT, held)
            else:
                self._push(t, _EVENT, ev)
            want_one = False

    @property
    def finished(self) -> bool:
        """Everything in the file has been delivered."""
        return self.exhausted and not self._heap

    @property
    def end_time(self) -> float | None:
        """The recording's last event time once the whole file has been read, else None."""
        return self.last_event_t if self.exhausted else None

    # -- the clock ---------------------------------------------------------------------------

    def _start(self, item: RequestRecord | HeldRecord) -> None:
        offsets: Sequence[float]
        cum: array[int] | list[int] | None
        if isinstance(item, HeldRecord):
            rec, offsets, cum = item.bare, item.offsets_view(), item.cum_tokens()
        else:
            rec, offsets = item, item.chunk_offsets_s
            cum = list(itertools.accumulate(rec.chunk_tokens))
        base_ns = round((rec.t_start - self.begin) * 1e9)
        a = ActiveRequest(
            id=rec.id, user=rec.user, model=rec.model, dialect=rec.dialect, path=rec.path,
            stream=rec.stream, t_start=rec.t_start, t0_ns=base_ns,
            concurrency_at_start=rec.concurrency_at_start,
        )
        lv = self._live[rec.id] = _Live(rec.t_start, offsets, cum, a, rec.status,
                                        rec.prompt_tokens, rec.upstream_id)
        self.active[rec.id] = a
        if rec.t_start < self.begin:
            # begun before the recording (started mid-traffic, or a rotated part read
            # alone): its chunks before the start are outside the span every rate runs
            # over; the aggregator is told of them and never counts them
            k = bisect.bisect_left(offsets, self.begin - rec.t_start)
            if k:
                _to_chunk(lv, k)
            self.aggregator.carry_in(a, a.tokens)

    def _progress_streams(self) -> None:
        """Bring every active request's first token / chunks / tokens up to ``now``."""
        for lv in self._live.values():
            k = bisect.bisect_right(lv.offsets, self.now - lv.t_start)
            if k != lv.active.chunks:
                _to_chunk(lv, k)

    def now_ns(self) -> int:
        """The virtual clock on the ``ActiveRequest`` nanosecond scale."""
        return round((self.now - self.begin) * 1e9)

    def _deliver(self, upto: float) -> None:
        """Start the requests and deliver the events due by ``upto`` (one batch)."""
        batch: list[Event] = []
        last_t = self.now
        heap = self._heap
        while heap and heap[0][0] <= upto:
            t, _, kind, item = heapq.heappop(heap)
            if kind == _START:
                if max(t, self.begin) < self.now - self.tick_s:  # (begun before: carried in)
                    self.late_starts += 1
                self._start(item)
                continue
            if isinstance(item, HeldRecord):
                item = item.unpack()
            if isinstance(item, RequestRecord):
                self._live.pop(item.id, None)
                self.active.pop(item.id, None)
            batch.append(item)
            last_t = max(last_t, t)
        if batch:
            self.now = last_t
            self.aggregator.on_events(batch)
            self.events_delivered += len(batch)

    def _skip_idle(self, tick_at: float, target: float) -> float:
        """The tick to play next: ``tick_at``, or — when nothing is in flight and nothing is
        due for more than ``IDLE_SKIP_S`` — the last tick before the next event (or
        ``target``), crossing the idle stretch in one step."""
        if self._live:
            return tick_at
        if self._heap:
            nxt = min(self._heap[0][0], target)
        elif self.exhausted:
            nxt = target
        else:
            return tick_at
        if nxt - tick_at <= IDLE_SKIP_S:
            return tick_at
        jump = max(tick_at, math.floor(nxt / self.tick_s) * self.tick_s)
        self.idle_skipped_s += jump - tick_at
        self._next_tick = jump
        return jump

    def _next_stop(self) -> float:
        """The next tick — or, before an idle stretch, the last tick before its end."""
        tick = self._next_tick
        self._fill(tick)
        if not self._live and self._heap and self._heap[0][0] - tick > IDLE_SKIP_S:
            return max(tick, math.floor(self._heap[0][0] / self.tick_s) * self.tick_s)
        return tick

    def advance_to(self, target: float, *, max_ticks: int | None = None) -> bool:
        """Play everything up to virtual time ``target``: a tick every ``tick_s`` (events
        delivered in batches that never cross one), then what is due by ``target``. With
        ``max_ticks``, stop early after that many ticks (returns False: call again) so a UI
        stays responsive."""
        ticks = 0
        agg = self.aggregator
        while True:
            tick_at = self._next_tick
            if tick_at > target:
                break
            self._fill(tick_at)
            tick_at = self._skip_idle(tick_at, target)
            self._fill(tick_at)
            self._deliver(tick_at)
            self.now = tick_at
            self._progress_streams()
            agg.tick(tick_at)
            self._next_tick = tick_at + self.tick_s
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                return self._next_tick > target
        if target > self.now:
            self._fill(target)
            self._deliver(target)
            self.now = target
            self._progress_streams()
        return True

    def run_to_end(self, on_tick: Callable[[float], None] | None = None) -> None:
        """Play the whole file, ending with the clock at the last event (not at a tick past
        it: rates over the session divide by the recording's own span); ``on_tick(now)``
        after every tick (for periodic snapshots) and once at the end."""
        while not self.exhausted:
            self.advance_to(self._next_stop())
            if on_tick is not None:
                on_tick(self.now)
        end = self.last_event_t if self.last_event_t is not None else self.begin
        while self._next_tick <= end:
            self.advance_to(min(self._next_stop(), end))
            if on_tick is not None:
                on_tick(self.now)
        self.advance_to(end)
        if on_tick is not None:
            on_tick(self.now)

    # -- views -----------------------------------------------------------------------------

    def snapshot(self, window_s: int | None) -> dict[str, Any]:
        return self.aggregator.snapshot(window_s)

    def active_requests(self) -> list[dict[str, Any]]:
        return self.aggregator.active_requests(self.now_ns())


class ReplaySource:
    """A recording as the TUI's snapshot source, with replay controls.

    Time runs at ``speed`` × the wall clock while playing; ``seek`` moves it (backwards
    restarts the engine and fast-forwards); at the end of the recording the picture holds
    (position stops at the duration). ``fetch`` adds a ``replay`` section to the snapshot
    (file, position_s, duration_s, speed, paused, at_end).
    """

    def __init__(self, path: Source, *, speed: float = 1.0, tick_s: float = 0.5,
                 slo: Mapping[str, Any] | None = None,
                 wall: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise RecordingError(f"replay speed must be positive, got {speed}")
        if not isinstance(path, Series):
            from llmtop.recording.parts import resolve

            path = resolve(path)  # (a stem: its parts, once, for every seek's new engine)
        self.source = path
        self.path = source_path(path)
        self._slo = slo
        self._tick_s = tick_s
        self._wall = wall
        self.engine = ReplayEngine(self.source, slo=slo, tick_s=tick_s)
        self._speed = float(speed)
        self._paused = False
        self._anchor_wall = wall()
        self._anchor_pos = 0.0
        self._duration = self._peek_duration()

    # -- position ----------------------------------------------------------------------------

    def _peek_duration(self) -> float | None:
        """For an uncompressed file, the footer or last line gives the length cheaply."""
        last = self.source.files[-1] if isinstance(self.source, Series) else self.path
        if last.name.endswith(".gz"):
            return None
        try:
            with open(last, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - 65536))
                tail = fh.read().splitlines()
        except OSError:
            return None
        begin = self.engine.begin
        times: list[float] = []  # the tail's event times, the last line's first
        ended: float | None = None
        for line in reversed(tail):
            try:
                obj = loads_line(line)
                # a footer's ended_at may be long after the last event: prefer events
                ev = decode_event(obj) if isinstance(obj, dict) else None
            except (ValueError, UnicodeDecodeError):  # InvalidLine is a ValueError
                continue
            if ev is None:
                end = obj.get("ended_at") if obj.get("type") == "footer" else None
                if isinstance(end, int | float) and math.isfinite(end):
                    ended = float(end)
                continue
            t = event_time(ev)
            if begin - MAX_GAP_S <= t:
                times.append(t)
        # the last time the reader will keep: one more than a day past the events before
        # it is skipped as damaged unless the footer or the start is near it (a year-late
        # digit in the last line made the length a year), as RecordingReader.events does
        for i, t in enumerate(times):
            near = [*times[i + 1:i + 2], begin, *([ended] if ended is not None else [])]
            if any(abs(t - x) <= MAX_GAP_S for x in near):
                return max(0.0, t - begin)
        return None

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        if math.isfinite(value) and value > 0:
            self._rebase()
            self._speed = float(value)

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def notes(self) -> tuple[str, ...]:
        """What the reader of a rotated recording should be told (``Series.notes``: other
        series, missing parts, parts recorded under other conditions), for the TUI to show
        (``llmtop.tui.source.HasNotes``); none for a file read alone."""
        src = self.source
        return src.notes if isinstance(src, Series) else ()

    @property
    def read_notes(self) -> tuple[str, ...]:
        """What the reader skipped or read with defaults so far (the lines report and
        export note, :func:`~llmtop.recording.report.fmt.file_notes`): known only as the
        file is read, so told when the replay ends."""
        from llmtop.recording.report.fmt import file_notes

        return tuple(file_notes(self.engine.reader.summary()))

    def _target_pos(self) -> float:
        if self._paused:
            return self._anchor_pos
        return self._anchor_pos + (self._wall() - self._anchor_wall) * self._speed

    def _rebase(self) -> None:
        self._anchor_pos = self._clamp(self._target_pos())
        self._anchor_wall = self._wall()

    def _clamp(self, pos: float) -> float:
        end = self.duration_s
        pos = max(0.0, pos)
        # advance_to delivers what is due by its target, so the end is the last event
        return min(pos, end) if end is not None else pos

    @property
    def position_s(self) -> float:
        pos = max(0.0, self.engine.now - self.engine.begin)
        end = self.duration_s
        return min(pos, end) if end is not None else pos

    @property
    def duration_s(self) -> float | None:
        end = self.engine.end_time
        if end is not None:  # remembered: a seek back rebuilds the engine, which must
            # read a .gz file to its end again before it knows
            self._duration = max(0.0, end - self.engine.begin)
        elif self.engine.exhausted and self.engine.last_event_t is None:
            self._duration = 0.0  # read to its end and no events: a header-only file
        return self._duration

    @property
    def at_end(self) -> bool:
        return self.engine.finished

    # -- ReplayControl ---------------------------------------------------------------------

    def pause(self) -> None:
        self._rebase()
        self._paused = True

    def resume(self) -> None:
        self._anchor_wall = self._wall()
        self._paused = False

    def seek(self, delta_s: float) -> None:
        self._rebase()
        self._anchor_pos = self._clamp(self._anchor_pos + delta_s)
        if self._anchor_pos < self.position_s - self._tick_s:
            lookahead = self.engine.lookahead_s  # grown to the longest request read so far
            self.engine.close()
            self.engine = ReplayEngine(self.source, slo=self._slo, tick_s=self._tick_s,
                                       lookahead_s=lookahead)

    async def _catch_up(self) -> None:
        stuck = False
        while True:
            eng = self.engine  # a seek during the sleep below may have replaced it
            goal = eng.begin + self._clamp(self._target_pos())
            step = goal
            last = eng.last_event_t
            if not stuck and not eng.exhausted and last is not None and goal > last:
                # the end is not known yet (a .gz file is read as it plays): go no further
                # than the last event read so far, so the clock never runs past the
                # recording's end (an empty picture at the end), nor out to a far target
                # (`--speed 1e308`, `--start 1e20`) where a tick no longer moves it
                step = max(eng.now, last)
            before = (eng.now, last, eng.exhausted)
            done = eng.advance_to(step, max_ticks=400)
            if done and step >= goal:
                break
            # no progress towards a bounded step: read on with the real goal next time
            stuck = done and before == (eng.now, eng.last_event_t, eng.exhausted)
            await asyncio.sleep(0)  # a long fast-forward: let the UI breathe
        if self.engine.finished:  # the end: hold the last picture (position stops there)
            self._rebase()

    # -- SnapshotSource ---------------------------------------------------------------------

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        await self._catch_up()
        snap = self.engine.snapshot(window_s)
        snap["replay"] = {
            "file": self.path.name,
            "position_s": self.position_s,
            "duration_s": self.duration_s,
            "speed": self._speed,
            "paused": self._paused,
            "at_end": self.at_end,
        }
        return snap

    async def active_requests(self) -> list[dict[str, Any]]:
        return self.engine.active_requests()

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        raise RecordingError("recording is not available while replaying a recording")

    def describe(self) -> str:
        pos = _clock(self.position_s)
        dur = self.duration_s
        state = " paused" if self._paused else ""
        total = f"/{_clock(dur)}" if dur is not None else ""
        return f"replay {self.path.name} {pos}{total} ×{self._speed:g}{state}"

    async def close(self) -> None:
        self.engine.close()


def _clock(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
