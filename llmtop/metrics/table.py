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
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from llmtop.metrics.hdr import COUNTS_LEN, HIGHEST_EQ, LOWEST_EQ, MEDIAN_EQ

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

SERIES_SPAN: Final = 1 << 16
"""Series ids per metric (far above any bounded label set)."""


def group_id(metric: int, series: int) -> int:
    return metric * SERIES_SPAN + series


@dataclass(frozen=True, slots=True)
class CountTable:
    """Sorted unique int64 ``keys`` with their positive int64 ``counts``."""

    keys: I64
    counts: I64

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
        w = np.ones(len(keys), dtype=np.int64) if weights is None else weights
        order = np.argsort(keys, kind="stable")
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

