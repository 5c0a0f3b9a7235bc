"""Rotating interval histograms and counters: every window is a merge of intervals.

Time is cut into *fine* intervals of 2 s and *coarse* intervals of 10 s, aligned to
multiples of their length in unix time. Each interval holds one :class:`CountTable` (all
latency histograms of all series) and a counter matrix ``[series, column]``. Windows:

=========  ==============================================================  =============
window     made of                                                         covers
=========  ==============================================================  =============
10         the last 5 completed fine intervals + the current one            10–12 s
60         the last 6 completed coarse intervals + the current coarse one   60–70 s
300        the last 30 completed coarse intervals + the current one         300–310 s
all        every completed coarse interval + the current one                the session
=========  ==============================================================  =============

(never earlier than the aggregator's start). Each window keeps a *running sum* of its
completed intervals, updated when an interval closes by adding the new one and
subtracting the one that left — exact, because counts are integers — so a snapshot only
merges the running sum with the small current interval(s), never re-scans events or
re-merges 30 intervals.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from llmtop.metrics.table import CountTable, SplitTable

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

FINE_S: Final = 2.0
FINE_N: Final = 5
COARSE_S: Final = 10.0
COARSE_N: Final = 30
WINDOWS: Final = (10, 60, 300)
"""Window lengths (s) offered besides ``None`` ("all", the whole session)."""

CONC_FIELDS: Final = ("in_flight", "waiting", "streaming")
"""Concurrency sampled at each tick: sums + sample count (for means) and maxima."""

_COARSE_FOR: Final = {60: 6, 300: 30}
_MAX_CATCHUP: Final = int(COARSE_N * COARSE_S / FINE_S) + 2 * int(COARSE_S / FINE_S)


@dataclass(slots=True)
class Interval:
    """One interval's data (mutable only through :meth:`Windows.remap_series`)."""

    start: float
    end: float
    table: CountTable
    counters: I64
    conc_sum: F64
    """Sums of the sampled in_flight, waiting, streaming, then the number of samples."""
    conc_max: F64

    @staticmethod
    def new(start: float, end: float, shape: tuple[int, int]) -> Interval:
        return Interval(start, end, CountTable.empty(), np.zeros(shape, dtype=np.int64),
                        np.zeros(len(CONC_FIELDS) + 1), np.zeros(len(CONC_FIELDS)))

    def absorb(self, other: Interval) -> None:
        self.table = self.table.plus(other.table) if len(self.table) >= len(other.table) \
            else other.table.plus(self.table)
        self.counters += other.counters
        self.conc_sum += other.conc_sum
        np.maximum(self.conc_max, other.conc_max, out=self.conc_max)
        self.end = max(self.end, other.end)


@dataclass(slots=True)
class WindowView:
    """What a window holds at query time."""

    start: float
    end: float
    split: SplitTable
    """The window's histograms: the running sum plus the open intervals."""
    counters: I64
    conc_sum: F64
    conc_max: F64

    @property
    def span_s(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def table(self) -> CountTable:
        """The window's histograms as one table (built on demand: O(size))."""
        return self.split.merged()


@dataclass(slots=True)
class _Closed:
    """A window's data but the current fine interval's: what its views add that to."""

    table: CountTable
    counters: I64
    conc_sum: F64
    conc_max: F64

    @staticmethod
    def of(run: _Running, ring: list[Interval], open_: list[Interval]) -> _Closed:
        """``run`` (a running sum of intervals; ``ring``: those intervals, for their
        concurrency) plus the intervals ``open_``. Concurrency sums add in the order
        ``ring``, ``open_``, then (in the view) the current interval: as they always did."""
        assert run.counters is not None
        counters = run.counters.copy()
        conc_sum = np.zeros(len(CONC_FIELDS) + 1)
        conc_max = np.zeros(len(CONC_FIELDS))
        for p in open_:
            counters += p.counters
        for p in [*ring, *open_]:
            conc_sum += p.conc_sum
            np.maximum(conc_max, p.conc_max, out=conc_max)
        table = CountTable.merge([run.table, *(p.table for p in open_)])
        return _Closed(table, counters, conc_sum, conc_max)


@dataclass(slots=True)
class _Running:
    table: CountTable = field(default_factory=CountTable.empty)
    counters: I64 | None = None


class Windows:
    """The interval rings and running sums for one aggregator.

    ``shape`` is the counter matrix shape ``(series capacity, columns)``. ``on_fine_closed``
    is called with every fine interval as it closes (for the time-series points).
    """

    def __init__(
        self,
        shape: tuple[int, int],
        start: float,
        on_fine_closed: Callable[[Interval], None] | None = None,
    ) -> None:
        self.shape = shape
        self.started_at = start
        self.on_fine_closed = on_fine_closed
        fs = math.floor(start / FINE_S) * FINE_S
        cs = math.floor(start / COARSE_S) * COARSE_S
        self.cur = Interval.new(fs, fs + FINE_S, shape)
        self.coarse_cur = Interval.new(cs, cs, shape)
        self.fine_ring: deque[Interval] = deque(maxlen=FINE_N)
        self.coarse_ring: deque[Interval] = deque(maxlen=COARSE_N)
        self.run: dict[int, _Running] = {w: self._zero_running() for w in WINDOWS}
        self.all = Interval.new(start, start, shape)
        self._closed_sums: dict[int | None, _Closed] = {}
        """Per window: its completed intervals plus the open coarse interval, summed (what
        changes only when a fine interval closes). A view then queries this table and the
        current fine interval, instead of merging the open intervals at every view and
        searching a small table of up to 10 s of data (60 s window, 64 users: a snapshot
        ~1.5 ms cheaper); its counters and concurrency are this sum's plus the current
        interval's (three numpy calls, not a copy and two for each of up to eight
        intervals)."""

    def _zero_running(self) -> _Running:
        return _Running(CountTable.empty(), np.zeros(self.shape, dtype=np.int64))

    # -- recording -----------------------------------------------------------------------

    def add(self, table: CountTable, counters: I64 | None = None) -> None:
        """Add data to the current interval (call :meth:`advance` first)."""
        if len(table):
            cur = self.cur.table
            self.cur.table = cur.plus(table) if len(cur) >= len(table) else table.plus(cur)
        if counters is not None:
            self.cur.counters += counters

    def add_to_total(self, column: int, values: I64) -> None:
        """Add ``values`` (one per series) to ``column`` of the all-time counters only —
        a correction the shorter windows take back later (the aggregator's live-token
        debt)."""
        self.all.counters[:, column] += values
        closed = self._closed_sums.get(None)  # "all" is the one window holding them
        if closed is not None:
            closed.counters[:, column] += values

    def sample(self, values: tuple[float, ...]) -> None:
        """Record one concurrency sample (in_flight, waiting, streaming)."""
        v = np.asarray(values, dtype=np.float64)
        self.cur.conc_sum[:-1] += v
        self.cur.conc_sum[-1] += 1
        np.maximum(self.cur.conc_max, v, out=self.cur.conc_max)

    # -- rotation ------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Close every interval that ended at or before ``now``."""
        if now < self.cur.end:
            return
        steps = int((now - self.cur.start) // FINE_S)
        if steps > _MAX_CATCHUP:
            # a long silence: flush real data into "all", then restart the rings from
            # empty intervals just old enough to fill every window
            self._close_fine()
            self._close_coarse()
            jump_to = math.floor((now - COARSE_N * COARSE_S - COARSE_S) / COARSE_S) * COARSE_S
            self.fine_ring.clear()
            self.coarse_ring.clear()
            for w in WINDOWS:
                self.run[w] = self._zero_running()
            self._closed_sums.clear()
            self.cur = Interval.new(jump_to, jump_to + FINE_S, self.shape)
            self.coarse_cur = Interval.new(jump_to, jump_to, self.shape)
        while now >= self.cur.end:
            self._close_fine()

    def _close_fine(self) -> None:
        self._closed_sums.clear()
        iv = self.cur
        if len(self.fine_ring) == FINE_N:
            self._sub(10, self.fine_ring[0])
        self.fine_ring.append(iv)
        self._add(10, iv)
        self.coarse_cur.absorb(iv)
        if self.on_fine_closed is not None:
            self.on_fine_closed(iv)
        self.cur = Interval.new(iv.end, iv.end + FINE_S, self.shape)
        if self.cur.start >= self.coarse_cur.start + COARSE_S - 1e-9:
            self._close_coarse()

    def _close_coarse(self) -> None:
        self._closed_sums.clear()
        civ = self.coarse_cur
        civ.end = civ.start + COARSE_S
        n = len(self.coarse_ring)
        if n >= _COARSE_FOR[60]:
            self._sub(60, self.coarse_ring[n - _COARSE_FOR[60]])
        if n == COARSE_N:
            self._sub(300, self.coarse_ring[0])
        self.coarse_ring.append(civ)
        self._add(60, civ)
        self._add(300, civ)
        self.all.absorb(civ)
        self.coarse_cur = Interval.new(civ.end, civ.end, self.shape)

    def _add(self, w: int, iv: Interval) -> None:
        r = self.run[w]
        r.table = r.table.plus(iv.table) if len(r.table) >= len(iv.table) \
            else iv.table.plus(r.table)
        assert r.counters is not None
        r.counters += iv.counters

    def _sub(self, w: int, iv: Interval) -> None:
        r = self.run[w]
        r.table = r.table.plus(iv.table, sign=-1)
        assert r.counters is not None
        r.counters -= iv.counters

    # -- queries -------------------------------------------------------------------------

    def view(self, window_s: int | None, now: float) -> WindowView:
        """The data of a window (``None`` = all) as of ``now`` (after :meth:`advance`)."""
        cur = self.cur
        if window_s == 10:
            start = cur.start - FINE_N * FINE_S
        elif window_s in _COARSE_FOR:
            start = self.coarse_cur.start - _COARSE_FOR[window_s] * COARSE_S
        elif window_s is None:
            start = self.started_at
        else:
            raise ValueError(f"window must be one of {WINDOWS} or None, got {window_s!r}")
        closed = self._closed_sums.get(window_s)
        if closed is None:
            closed = self._closed_sums[window_s] = self._closed(window_s)
        return WindowView(max(start, self.started_at), max(now, self.started_at),
                          SplitTable(closed.table, cur.table), closed.counters + cur.counters,
                          closed.conc_sum + cur.conc_sum,
                          np.maximum(closed.conc_max, cur.conc_max))

    def _closed(self, window_s: int | None) -> _Closed:
        """A window's data but the current fine interval's: its running sum, the
        concurrency of the intervals in it (which no running sum keeps) and its open
        coarse interval."""
        if window_s == 10:
            return _Closed.of(self.run[10], list(self.fine_ring), [])
        if window_s is None:
            return _Closed.of(_Running(self.all.table, self.all.counters), [self.all],
                              [self.coarse_cur])
        ring = list(self.coarse_ring)[-_COARSE_FOR[window_s]:]
        return _Closed.of(self.run[window_s], ring, [self.coarse_cur])

    # -- label folding -------------------------------------------------------------------

    def remap_series(self, mapping: dict[int, int]) -> None:
        """Fold series into others everywhere (``{old: new}``), e.g. a demoted user into
        "other". Totals are unchanged."""
        if not mapping:
            return
        self._closed_sums.clear()
        seen: set[int] = set()
        intervals = [self.cur, self.coarse_cur, self.all, *self.fine_ring, *self.coarse_ring]
        for iv in intervals:
            if id(iv) in seen:
                continue
            seen.add(id(iv))
            iv.table = iv.table.remap_series(mapping)
            _fold_rows(iv.counters, mapping)
        for r in self.run.values():
            r.table = r.table.remap_series(mapping)
            assert r.counters is not None
            _fold_rows(r.counters, mapping)


def _fold_rows(m: I64, mapping: dict[int, int]) -> None:
    for old, new in mapping.items():
        m[new] += m[old]
        m[old] = 0
