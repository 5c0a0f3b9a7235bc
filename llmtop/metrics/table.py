"""Sparse count tables: many HDR histograms in two sorted numpy arrays.

A key packs ``(metric, series, hdr index)`` into one int64::

    key = (metric * SERIES_SPAN + series) * COUNTS_LEN + index

so one table holds every latency histogram of one interval — system, each tracked user,
each model — and the histogram of one (metric, series) is a contiguous slice. Keys are
sorted and unique, counts positive. Tables are immutable values: operations return new
tables, so a window's merged table can be cached and shared.

Costs: building from values sorts once (``O(n log n)``); adding a small table into a big
one is ``O(big + small·log big)`` with no re-sort (searchsorted + insert), which keeps the
running window sums cheap; grouped percentiles are one cumsum and one searchsorted over
the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from llmtop.metrics.hdr import COUNTS_LEN, HIGHEST_EQ, LOWEST_EQ, MEDIAN_EQ

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

SERIES_SPAN: Final = 1 << 16
"""Series ids per metric (far above any bounded label set)."""
_NARROW_STEPS: Final = 1
"""Steps of :meth:`SplitTable._narrow` before the big search."""
_ENUMERATE: Final = 2048
""":meth:`SplitTable._first_big_key` evaluates every candidate left once there are at most
this many (all searches together) instead of halving on."""


def group_id(metric: int, series: int) -> int:
    return metric * SERIES_SPAN + series


@dataclass(frozen=True, slots=True)
class CountTable:
    """Sorted unique int64 ``keys`` with their positive int64 ``counts``."""

    keys: I64
    counts: I64
    _cum0: I64 | None = field(default=None, compare=False, repr=False)
    _mcum0: I64 | None = field(default=None, compare=False, repr=False)

    def cum0(self) -> I64:
        """``[0, c0, c0+c1, ...]``: counts with key ≤ ``keys[i]`` at ``i+1`` (cached)."""
        if self._cum0 is None:
            c = np.zeros(len(self.counts) + 1, dtype=np.int64)
            np.cumsum(self.counts, out=c[1:])
            object.__setattr__(self, "_cum0", c)
            return c
        return self._cum0

    def mcum0(self) -> I64:
        """Like :meth:`cum0`, of count × bucket midpoint (µs), in exact integers: for sums
        and means that equal :func:`group_stats`'s to the last bit (cached)."""
        if self._mcum0 is None:
            m = np.zeros(len(self.counts) + 1, dtype=np.int64)
            np.cumsum(self.counts * MEDIAN_EQ[self.keys % COUNTS_LEN], out=m[1:])
            object.__setattr__(self, "_mcum0", m)
            return m
        return self._mcum0

    def count_le(self, keys: I64) -> I64:
        """How many counts have a key ≤ each of ``keys`` (vectorised)."""
        return self.cum0()[np.searchsorted(self.keys, keys, side="right")]

    @staticmethod
    def empty() -> CountTable:
        return _EMPTY

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @staticmethod
    def from_keys(keys: I64, weights: I64 | None = None) -> CountTable:
        """Count occurrences (or sum ``weights``) of each key."""
        if len(keys) == 0:
            return _EMPTY
        if weights is None or bool((weights == 1).all()):
            # counting only (a batch of one-token chunks): a sort, no argsort
            k = np.sort(keys)
            start = np.flatnonzero(np.diff(k, prepend=np.int64(-1)) != 0)
            return CountTable(k[start], np.diff(start, append=len(k)))
        w = weights
        order = np.argsort(keys)
        k, c = keys[order], w[order]
        start = np.flatnonzero(np.diff(k, prepend=np.int64(-1)) != 0)
        out_k, out_c = k[start], np.add.reduceat(c, start)
        nz = out_c != 0
        if not nz.all():
            out_k, out_c = out_k[nz], out_c[nz]
        return CountTable(out_k, out_c)

    @staticmethod
    def merge(tables: Sequence[CountTable]) -> CountTable:
        """The sum of several tables."""
        parts = [t for t in tables if len(t)]
        if not parts:
            return _EMPTY
        if len(parts) == 1:
            return parts[0]
        if len(parts) == 2:
            big, small = sorted(parts, key=len, reverse=True)
            return big.plus(small)
        return CountTable.from_keys(
            np.concatenate([t.keys for t in parts]), np.concatenate([t.counts for t in parts])
        )

    def plus(self, other: CountTable, sign: int = 1) -> CountTable:
        """``self + sign * other`` (``sign=-1`` removes an interval from a running sum).

        Linear in ``len(self)``; ``other`` should be the smaller table. Zero counts that
        result are dropped.
        """
        if len(other) == 0:
            return self
        oc = other.counts if sign == 1 else other.counts * sign
        if len(self) == 0:
            return CountTable(other.keys, oc)
        pos = np.searchsorted(self.keys, other.keys)
        pos_c = np.minimum(pos, len(self.keys) - 1)
        match = self.keys[pos_c] == other.keys
        counts = self.counts.copy()
        counts[pos_c[match]] += oc[match]
        new = ~match
        if new.any():
            keys = np.insert(self.keys, pos[new], other.keys[new])
            counts = np.insert(counts, pos[new], oc[new])
        else:
            keys = self.keys
        nz = counts != 0
        if not nz.all():
            keys, counts = keys[nz], counts[nz]
        return CountTable(keys, counts)

    def group_slice(self, metric: int, series: int) -> tuple[I64, I64]:
        """The one histogram of (metric, series): ``(hdr indices, counts)``."""
        g = group_id(metric, series)
        lo, hi = np.searchsorted(self.keys, [g * COUNTS_LEN, (g + 1) * COUNTS_LEN])
        return self.keys[lo:hi] - g * COUNTS_LEN, self.counts[lo:hi]

    def range_slice(self, g_lo: int, g_hi: int) -> CountTable:
        """Groups ``g_lo <= group < g_hi`` (a view)."""
        lo, hi = np.searchsorted(self.keys, [g_lo * COUNTS_LEN, g_hi * COUNTS_LEN])
        return CountTable(self.keys[lo:hi], self.counts[lo:hi])

    def remap_series(self, mapping: dict[int, int]) -> CountTable:
        """Move whole series to others (``{old: new}``), summing where they meet."""
        if not mapping or len(self) == 0:
            return self
        group = self.keys // COUNTS_LEN
        series = group % SERIES_SPAN
        new_series = series.copy()
        for old, new in mapping.items():
            new_series[series == old] = new
        if np.array_equal(new_series, series):
            return self
        keys = self.keys + (new_series - series) * COUNTS_LEN
        return CountTable.from_keys(keys, self.counts)


_EMPTY: Final = CountTable(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
_EMPTY.keys.flags.writeable = False
_EMPTY.counts.flags.writeable = False


def _short_of(first: I64, lens: I64, cum: I64, keys: I64, other: CountTable,
              target: I64) -> I64:
    """For each run of a table's indices ``first[i] .. first[i] + lens[i] - 1`` (``cum`` its
    cumulative counts, ``keys`` its keys): how many at its start fall short of
    ``target[i]`` in the sum with ``other`` — all runs in one pass. The sum's count is
    monotone along a run, so its first index that reaches the target is ``first`` plus
    that (``first + lens`` when none does)."""
    offs = np.cumsum(lens) - lens
    total = int(offs[-1] + lens[-1]) if len(lens) else 0
    idx = np.arange(total) + np.repeat(first - offs, lens)
    short = cum[idx] + other.count_le(keys[idx]) < np.repeat(target, lens)
    below = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(short, out=below[1:])
    out: I64 = below[offs + lens] - below[offs]
    return out


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Per-group summary of a table: one row per (metric, series) group present.

    ``values[g, j]`` is the value (µs) at ``ps[j]`` of group ``groups[g]``.
    """

    groups: I64
    totals: I64
    values: I64
    maxes: I64
    means: F64
    ps: tuple[float, ...]

    def lookup(self, metric: int, series: int) -> int | None:
        g = group_id(metric, series)
        i = int(np.searchsorted(self.groups, g))
        if i < len(self.groups) and self.groups[i] == g:
            return i
        return None


def group_stats(table: CountTable, ps: Sequence[float]) -> GroupStats:
    """Percentiles, max, mean and count of every histogram in ``table`` at once.

    Percentiles follow hdrh exactly (see :func:`llmtop.metrics.hdr.sparse_percentiles`).
    """
    ps_t = tuple(float(p) for p in ps)
    if len(table) == 0:
        z = np.empty(0, dtype=np.int64)
        return GroupStats(z, z, np.empty((0, len(ps_t)), np.int64), z, np.empty(0), ps_t)
    keys, counts = table.keys, table.counts
    group = keys // COUNTS_LEN
    idx = keys - group * COUNTS_LEN
    starts = np.flatnonzero(np.diff(group, prepend=np.int64(-1)) != 0)
    ends = np.append(starts[1:], len(keys))
    cum = np.cumsum(counts)
    before = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0)
    totals = cum[ends - 1] - before
    # hdrh's target count, vectorised with the same float arithmetic
    p_arr = np.minimum(np.array(ps_t, dtype=np.float64), 100.0)
    targets = np.maximum(
        np.floor(p_arr[None, :] * totals[:, None].astype(np.float64) / 100 + 0.5), 1
    ).astype(np.int64)
    pos = np.searchsorted(cum, before[:, None] + targets, side="left")
    pos = np.minimum(pos, (ends - 1)[:, None])
    at = idx[pos]
    values = np.where(np.array(ps_t)[None, :] == 0, LOWEST_EQ[at], HIGHEST_EQ[at])
    maxes = HIGHEST_EQ[idx[ends - 1]]
    sums = np.add.reduceat(counts * MEDIAN_EQ[idx], starts)
    means = sums / totals
    return GroupStats(group[starts], totals, values.astype(np.int64), maxes, means, ps_t)



@dataclass(frozen=True, slots=True)
class SplitTable:
    """A window's histograms as a big table (the running sum of completed intervals, with
    cached prefix sums) plus a small one (the intervals still open), queried as their sum
    without building it: percentiles and bucket counts cost ``O(groups · log n)``, not
    ``O(n)``. :meth:`merged` builds the sum when really needed (tests, exact exports).
    """

    big: CountTable
    small: CountTable

    def merged(self) -> CountTable:
        return CountTable.merge([self.big, self.small])

    def count_le(self, keys: I64) -> I64:
        """Counts with key ≤ each of ``keys`` in the sum of both tables."""
        return self.big.count_le(keys) + self.small.count_le(keys)

    def group_hist(self, metric: int, series: int) -> tuple[I64, I64]:
        """One (metric, series) histogram of the sum: ``(hdr indices, counts)``."""
        bi, bc = self.big.group_slice(metric, series)
        si, sc = self.small.group_slice(metric, series)
        if len(si) == 0:
            return bi, bc
        if len(bi) == 0:
            return si, sc
        t = CountTable(bi, bc).plus(CountTable(si, sc))
        return t.keys, t.counts

    def extract(self, groups: Sequence[int]) -> CountTable:
        """The summed histograms of ``groups`` packed as one table whose group ``j`` is the
        ``j``-th requested group (``key = j * COUNTS_LEN + index``). O(their size)."""
        bounds = np.array([[g * COUNTS_LEN, (g + 1) * COUNTS_LEN] for g in groups],
                          dtype=np.int64).ravel()
        parts: list[CountTable] = []
        for t in (self.big, self.small):
            if len(t) == 0:
                continue
            pos = np.searchsorted(t.keys, bounds)
            lens = pos[1::2] - pos[0::2]
            if not lens.any():
                continue
            take = np.concatenate([np.arange(a, b) for a, b in zip(pos[0::2].tolist(),
                                                                    pos[1::2].tolist(),
                                                                    strict=True)])
            shift = np.repeat(bounds[0::2] - np.arange(len(groups)) * COUNTS_LEN, lens)
            parts.append(CountTable(t.keys[take] - shift, t.counts[take]))
        return CountTable.merge(parts)

    def group_totals(self, groups: I64) -> tuple[I64, I64]:
        """``(counts before each group, counts in it)``."""
        lo = self.count_le(groups * COUNTS_LEN - 1)
        hi = self.count_le((groups + 1) * COUNTS_LEN - 1)
        return lo, hi - lo

    def group_sums_us(self, groups: I64) -> F64:
        """Sum of the values (bucket midpoints, µs) of each group (:meth:`group_sums_exact`
        as floats)."""
        return self.group_sums_exact(groups).astype(np.float64)

    def group_sums_exact(self, groups: I64) -> I64:
        """Sum of the values (bucket midpoints, µs) of each group as exact integers: what
        :func:`group_stats` sums (its means are these over the totals)."""
        out = np.zeros(len(groups), dtype=np.int64)
        n = len(groups)
        bounds = np.concatenate([groups * COUNTS_LEN, (groups + 1) * COUNTS_LEN])
        for t in (self.big, self.small):
            if len(t) == 0:
                continue
            m = t.mcum0()[np.searchsorted(t.keys, bounds, side="left")]
            out += m[n:] - m[:n]
        return out

    def group_percentiles(self, groups: I64, ps: Sequence[float]) -> tuple[I64, I64, I64]:
        """For each group: ``(total count, values at ps (µs) [G, P], max (µs))``.

        Exactly hdrh's rule on the summed histogram. Values of empty groups are 0.
        """
        groups = np.asarray(groups, dtype=np.int64)
        n_g, n_p = len(groups), len(ps)
        p_arr = np.minimum(np.asarray(ps, dtype=np.float64), 100.0)
        lo_keys = groups * COUNTS_LEN
        # per table, one search for both ends of every group: the keys below it, and the
        # keys up to its last (keys are integers: ≤ hi - 1 is < hi, so the second also
        # points just past each group's largest key, for the maxima)
        bounds = np.concatenate([lo_keys - 1, lo_keys + (COUNTS_LEN - 1)])
        big, small = self.big, self.small
        b_pos = np.searchsorted(big.keys, bounds, side="right")
        s_pos = np.searchsorted(small.keys, bounds, side="right")
        b_cum, s_cum = big.cum0()[b_pos], small.cum0()[s_pos]
        big_before, small_before = b_cum[:n_g], s_cum[:n_g]
        big_in, small_in = b_cum[n_g:] - big_before, s_cum[n_g:] - small_before
        totals = big_in + small_in
        t = np.maximum(np.floor(p_arr[None, :] * totals[:, None].astype(np.float64) / 100
                                + 0.5), 1).astype(np.int64)
        # the combined count C(k) = big(≤k) + small(≤k) is monotone in k; the answer is the
        # first key of either table where C reaches before_big + before_small + t
        target = ((big_before + small_before)[:, None] + t).ravel()
        # the big table's own cumulative count there lies in [cum_lo, cum_hi] (the small
        # table adds 0..its count in the group)
        cum_hi = (big_before[:, None] + t).ravel()
        cum_lo = ((big_before - small_in)[:, None] + t).ravel()
        ca = big.cum0()[1:]
        lo = np.searchsorted(ca, cum_lo, side="left")
        hi = np.searchsorted(ca, cum_hi, side="left")
        if len(small) and len(big):
            self._narrow(target, lo, hi)
        key_small = self._first_small_key(target, np.repeat(s_pos[:n_g], n_p),
                                          np.repeat(s_pos[n_g:], n_p), lo, hi)
        key_big = self._first_big_key(target, lo, hi)
        key = np.minimum(key_small, key_big).reshape(n_g, n_p)
        idx = np.clip(key - lo_keys[:, None], 0, COUNTS_LEN - 1)
        zero = p_arr == 0
        vals = np.where(zero[None, :], LOWEST_EQ[idx], HIGHEST_EQ[idx]) if zero.any() \
            else HIGHEST_EQ[idx]
        values = np.where(totals[:, None] > 0, vals, 0)
        maxes = np.zeros(n_g, dtype=np.int64)
        for tb, pos in ((big, b_pos), (small, s_pos)):
            if len(tb) == 0:
                continue
            last = pos[n_g:] - 1  # the group's largest key, when it has one here
            inside = last >= pos[:n_g]
            k = tb.keys[np.maximum(last, 0)]
            m = np.where(inside, HIGHEST_EQ[np.clip(k - lo_keys, 0, COUNTS_LEN - 1)], 0)
            np.maximum(maxes, m, out=maxes)
        return totals, values.astype(np.int64), maxes

    def _narrow(self, target: I64, lo: I64, hi: I64) -> None:
        """Tighten, in place, the big indices ``lo`` (every big key before it falls short
        of ``target``) and ``hi`` (its key reaches it, or ``hi`` is ``len(big)``) between
        which the big search looks: what the small table adds at the key ``hi`` (at most)
        and at ``lo`` (at least) bounds what the big table must add. With the small table
        a few seconds of a minute's data each step leaves a few percent of the range."""
        a, small = self.big, self.small
        n = len(a)
        ca = a.cum0()[1:]
        todo = np.flatnonzero(lo < hi)
        for _ in range(_NARROW_STEPS):
            if len(todo) == 0:
                return
            t, lt, ht = target[todo], lo[todo], hi[todo]
            # up to ht's key the small table adds at most what it has there: a big count
            # below the rest falls short
            lt = np.maximum(lt, np.searchsorted(
                ca, t - small.count_le(a.keys[np.minimum(ht, n - 1)]), side="left"))
            # from lt on the small table adds at least what it has at lt's key: the first
            # index past lt where the big count makes up the rest reaches the target
            ht = np.minimum(ht, np.maximum(lt, np.searchsorted(
                ca, t - small.count_le(a.keys[np.minimum(lt, n - 1)]), side="left")))
            lo[todo], hi[todo] = lt, ht
            todo = todo[lt < ht]

    def _first_small_key(self, target: I64, s_lo: I64, s_hi: I64,
                         big_lo: I64, big_hi: I64) -> I64:
        """First small key where C reaches ``target``, or int64 max where none does before
        the big table's answer. The answer lies in its group (small indices ``s_lo`` to
        ``s_hi``) and between the big keys at ``big_lo - 1`` and ``big_hi`` (the bounds of
        the big search: C is below target at the one and reaches it at the other); only the
        few small keys inside both bounds are looked at (C at every small key — a search
        of the big table for each — was most of a snapshot's build)."""
        s, a = self.small, self.big
        m, n = len(s), len(a)
        out = np.full(len(target), np.iinfo(np.int64).max, dtype=np.int64)
        if m == 0:
            return out
        cs = s.cum0()[1:]
        if n == 0:  # C is the small table's own count
            j = np.searchsorted(cs, target, side="left")
            return np.where(j < m, s.keys[np.minimum(j, m - 1)], out)
        k_lo = np.where(big_lo > 0, a.keys[np.maximum(big_lo - 1, 0)], -1)
        k_hi = np.where(big_hi < n, a.keys[np.minimum(big_hi, n - 1)], np.iinfo(np.int64).max)
        start = np.maximum(np.searchsorted(s.keys, k_lo, side="right"), s_lo)
        end = np.minimum(np.searchsorted(s.keys, k_hi, side="right"), s_hi)
        some = np.flatnonzero(end > start)
        if len(some) == 0:
            return out
        # every candidate of every search at once
        st, en = start[some], end[some]
        j = st + _short_of(st, en - st, cs, s.keys, a, target[some])
        found = j < en
        out[some[found]] = s.keys[j[found]]
        return out

    def _first_big_key(self, target: I64, lo: I64, hi: I64) -> I64:
        """First big key where C reaches ``target``, searched between the big indices
        ``lo`` and ``hi`` (every big key before ``lo`` falls short, the one at ``hi``
        reaches it, or ``hi`` is ``len(big)``): a vectorised binary search, down to a few
        candidates evaluated at once."""
        a = self.big
        n = len(a)
        none = np.full(len(target), np.iinfo(np.int64).max, dtype=np.int64)
        if n == 0:
            return none
        ca = a.cum0()[1:]
        lo, hi = lo.copy(), hi.copy()
        if len(self.small):
            todo = np.flatnonzero(lo < hi)  # only the still-open searches, each round
            while len(todo):
                lt, ht = lo[todo], hi[todo]
                width = ht - lt
                if int(width.sum()) <= _ENUMERATE:
                    # few candidates left: all of them at once rather than a round each
                    # halving (a round is some twenty numpy calls, whatever their size)
                    lo[todo] = lt + _short_of(lt, width, ca, a.keys, self.small, target[todo])
                    break
                mid = lt + width // 2  # < hi ≤ n
                reach = ca[mid] + self.small.count_le(a.keys[mid]) >= target[todo]
                hi[todo[reach]] = mid[reach]
                lo[todo[~reach]] = mid[~reach] + 1
                todo = todo[lo[todo] < hi[todo]]
        found = lo < n
        return np.where(found, a.keys[np.minimum(lo, n - 1)], none)
