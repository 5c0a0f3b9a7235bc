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

import math
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
_NONE: Final = np.iinfo(np.int64).max
"""No key (a search past a table's end)."""
_BLOCK_MIN: Final = 6
""":meth:`SplitTable._first_small` searches in blocks when they would hold at least this
many keys (smaller ones save fewer searches than their extra numpy calls cost)."""


def group_id(metric: int, series: int) -> int:
    return metric * SERIES_SPAN + series


@dataclass(frozen=True, slots=True)
class CountTable:
    """Sorted unique int64 ``keys`` with their positive int64 ``counts``."""

    keys: I64
    counts: I64
    _cum0: I64 | None = field(default=None, compare=False, repr=False)
    _mcum0: I64 | None = field(default=None, compare=False, repr=False)
    _keys_end: I64 | None = field(default=None, compare=False, repr=False)

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

    def keys_end(self) -> I64:
        """``keys`` and int64 max after them: ``keys_end()[i]`` for a search's result
        ``i`` (up to ``len``) is the key there, or "none" past the end (cached)."""
        if self._keys_end is None:
            k = np.append(self.keys, _NONE)
            object.__setattr__(self, "_keys_end", k)
            return k
        return self._keys_end

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
            keys, counts = _insert(self.keys, counts, pos[new], other.keys[new], oc[new])
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


def _insert(keys: I64, counts: I64, pos: I64, new_keys: I64, new_counts: I64
            ) -> tuple[I64, I64]:
    """``keys`` and ``counts`` with ``new_keys``/``new_counts`` inserted before the indices
    ``pos`` (ascending, as a search of sorted keys gives them): what two ``np.insert``
    calls do, with their positions worked out once and no sort of them (np.insert's
    checks and argsort were some twenty numpy calls per :meth:`CountTable.plus`)."""
    n, k = len(keys), len(new_keys)
    at = pos + np.arange(k)  # where each new one lands: after the k' < k inserted before it
    old = np.ones(n + k, dtype=np.bool_)
    old[at] = False
    out_k = np.empty(n + k, dtype=np.int64)
    out_c = np.empty(n + k, dtype=np.int64)
    out_k[at], out_k[old] = new_keys, keys
    out_c[at], out_c[old] = new_counts, counts
    return out_k, out_c


_EMPTY: Final = CountTable(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
_EMPTY.keys.flags.writeable = False
_EMPTY.counts.flags.writeable = False


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
class GroupSummary:
    """What :meth:`SplitTable.group_summary` gives, one row per requested group: ``values``
    is ``[G, P]`` (µs at each percentile); ``sums`` are Σ count × bucket midpoint (µs),
    exact integers."""

    totals: I64
    values: I64
    maxes: I64
    sums: I64


_PERCENT_ROWS: dict[tuple[float, ...], tuple[F64, npt.NDArray[np.bool_] | None]] = {}


def _percent_row(ps: tuple[float, ...]) -> tuple[F64, npt.NDArray[np.bool_] | None]:
    """``ps`` capped at 100, then 100 (the maxima's column), as a ``[1, P+1]`` row; and
    which are 0 (their value is a bucket's lowest, not highest), ``None`` for none.
    Remembered per ``ps`` (a handful of tuples: the snapshot's, Prometheus', tests')."""
    got = _PERCENT_ROWS.get(ps)
    if got is None:
        row = np.minimum(np.array([[*ps, 100.0]], dtype=np.float64), 100.0)
        zero = row == 0
        got = (row, zero if zero.any() else None)
        if len(_PERCENT_ROWS) < 64:
            _PERCENT_ROWS[ps] = got
    return got


@dataclass(frozen=True, slots=True)
class SplitTable:
    """A window's histograms as a big table (the running sum of completed intervals, with
    cached prefix sums) plus a small one (the intervals still open), queried as their sum
    without building it: bucket counts cost ``O(groups · log n)`` and percentiles a search
    of (some of) the small table's keys in the big one besides, not a merge of the two.
    :meth:`merged` builds the sum when really needed (tests, exact exports).
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
        """For each group: ``(total count, values at ps (µs) [G, P], max (µs))``
        (:meth:`group_summary` without the sums)."""
        g = self.group_summary(groups, ps)
        return g.totals, g.values, g.maxes

    def group_summary(self, groups: I64 | Sequence[int], ps: Sequence[float]) -> GroupSummary:
        """Totals, values at ``ps``, maxima and exact sums of each group (:class:`GroupSummary`).

        Exactly hdrh's rule on the summed histogram. Values of empty groups are 0. The
        maximum is the value at 100 % (the group's largest key), searched with the others
        as one more column; the sums come from the same searches of the group bounds as
        the totals (what :meth:`group_sums_exact` gives). Each numpy call counts: a
        snapshot meets numpy's code and data cold twice a second, some 5 µs a call."""
        groups = np.asarray(groups, dtype=np.int64)
        n_g = len(groups)
        big, small = self.big, self.small
        lo_keys = groups * COUNTS_LEN
        bounds = np.concatenate([lo_keys, lo_keys + COUNTS_LEN])
        b_pos, s_pos = big.keys.searchsorted(bounds), small.keys.searchsorted(bounds)
        cum = big.cum0()[b_pos] + small.cum0()[s_pos]
        mid = big.mcum0()[b_pos] + small.mcum0()[s_pos]
        before, totals, sums = cum[:n_g], cum[n_g:] - cum[:n_g], mid[n_g:] - mid[:n_g]
        p_row, zero = _percent_row(tuple(ps))
        t = np.maximum(np.floor(p_row * totals[:, None].astype(np.float64) / 100 + 0.5), 1)
        key = self._first_keys((before[:, None] + t.astype(np.int64)).ravel())
        # every key reaching before + 1 is in the group or after it: the index is ≥ 0
        idx = np.minimum(key.reshape(n_g, p_row.shape[1]) - lo_keys[:, None], COUNTS_LEN - 1)
        vals = np.where(zero, LOWEST_EQ[idx], HIGHEST_EQ[idx]) if zero is not None \
            else HIGHEST_EQ[idx]
        values = np.where(totals[:, None] > 0, vals, 0)
        return GroupSummary(totals, values[:, :-1], values[:, -1], sums)

    def _first_keys(self, target: I64) -> I64:
        """For each of ``target``: the first key of either table where the summed count
        ``C(k) = big(≤k) + small(≤k)`` reaches it (int64 max where none does).

        The first small key ``s[j]`` reaching the target comes from ``C`` at the small keys
        (:meth:`_first_small`). Between ``s[j-1]`` (short of it) and ``s[j]`` the small
        count is fixed (``small.cum0()[j]``), so the first big key where the big count
        makes up the rest reaches the target if it lies before ``s[j]`` (it lies past
        ``s[j-1]``: ``C`` there falls short), and the answer is the smaller of the two
        keys. Some fifteen numpy calls whatever the targets: the bounded searches of both
        tables this replaces took some eighty, each a fixed cost that dominated at a
        proxy's sizes (thousands of keys), on caches gone cold since the last build."""
        a, s = self.big, self.small
        if not len(s):
            return a.keys_end()[a.cum0()[1:].searchsorted(target)]
        j = self._first_small(target)
        key_s = s.keys_end()[j]
        if not len(a):
            return key_s
        key_b = a.keys_end()[a.cum0()[1:].searchsorted(target - s.cum0()[j])]
        return np.minimum(key_s, key_b)

    def _first_small(self, target: I64) -> I64:
        """For each of ``target``: the first small index where ``C`` reaches it
        (``len(small)`` where none does). ``C`` at a small key is its own cumulative count
        plus a search in the big table; a large small table (10,000 keys of widely spread
        latencies in the last 2 s) is searched in two steps instead of at every key: ``C`` at
        the last key of every block of ``k`` finds each target's block, then the ``k`` keys
        of that block only (~2·√(keys·targets) searches rather than one per key)."""
        s, a = self.small, self.big
        m = len(s)
        k = math.isqrt(m // max(len(target), 1))
        if k < _BLOCK_MIN:  # C at every small key
            c_s = s.cum0()[1:] + a.cum0()[a.keys.searchsorted(s.keys, side="right")]
            every: I64 = c_s.searchsorted(target)
            return every
        # the block of each target's first reaching key: past the last whole block, the
        # keys after it (a partial block, or none reaches the target: all fall short)
        block = _count_at(s, a, np.arange(k - 1, m, k)).searchsorted(target)
        idx = np.minimum(block[:, None] * k + np.arange(k), m - 1)
        short = (_count_at(s, a, idx) < target[:, None]).sum(axis=1)
        out: I64 = np.minimum(block * k + short, m)
        return out


def _count_at(t: CountTable, other: CountTable, i: I64) -> I64:
    """``C`` at ``t``'s keys ``i``: counts with a key up to each in ``t`` and ``other``."""
    out: I64 = t.cum0()[i + 1] + other.cum0()[other.keys.searchsorted(t.keys[i], side="right")]
    return out
