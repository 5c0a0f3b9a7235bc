"""Requests in flight, exactly, from the recorded requests' start and end times.

Live, the aggregator samples the proxy's open requests once per tick; a report has every
request's ``t_start`` and ``e2e_s``, so it need not sample: the number in flight is a step
function that rises by one at each start and falls by one at each end. Its maximum is the
largest overlap of the records; its mean over a span is the area under it divided by the
span — Σ (each request's time inside the span) ÷ span, Little's law's L. (A tick-sampled
figure misses peaks between ticks, and the replay only knows a request once it has read its
record, so a request longer than the read-ahead showed as in flight for part of its life.)

A request that ends at the instant another starts does not overlap it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


class StepCount:
    """How many intervals ``[start, end)`` are open at each moment (a step function)."""

    def __init__(self, starts: Sequence[float] | F64, ends: Sequence[float] | F64) -> None:
        s = np.asarray(starts, dtype=np.float64)
        e = np.asarray(ends, dtype=np.float64)
        keep = np.isfinite(s) & np.isfinite(e)
        s, e = s[keep], np.maximum(e[keep], s[keep])
        t = np.concatenate([s, e])
        d = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])
        order = np.lexsort((d, t))  # at equal times ends (−1) before starts (+1)
        self.t: F64 = t[order]
        self.level = np.cumsum(d[order])
        """The count from ``t[i]`` until ``t[i + 1]``."""
        widths = np.diff(self.t)
        self._area = np.concatenate([[0.0], np.cumsum(self.level[:-1] * widths)])
        """The integral of the count from ``t[0]`` to ``t[i]``."""

    def _integral_to(self, x: F64) -> F64:
        k = np.searchsorted(self.t, x, side="right") - 1
        kc = np.maximum(k, 0)
        val = self._area[kc] + self.level[kc] * (x - self.t[kc])
        out: F64 = np.where(k >= 0, val, 0.0)
        return out

    def means(self, a: F64, b: F64) -> F64:
        """Mean count over each ``[a[i], b[i]]`` (NaN where ``b ≤ a``)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if not len(self.t):
            return np.where(b > a, 0.0, np.nan)
        width = b - a
        area = self._integral_to(b) - self._integral_to(a)
        out: F64 = np.where(width > 0, area / np.where(width > 0, width, 1.0), np.nan)
        return out

    def maxima(self, a: F64, b: F64) -> npt.NDArray[np.int64]:
        """Largest count at any moment of each ``[a[i], b[i])``."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        out = np.zeros(len(a), dtype=np.int64)
        if not len(self.t):
            return out
        lo = np.searchsorted(self.t, a, side="right") - 1  # the step in force at a
        hi = np.searchsorted(self.t, b, side="left")  # steps that begin before b
        for i in range(len(a)):
            j0, j1 = max(int(lo[i]), 0), int(hi[i])
            at_a = int(self.level[lo[i]]) if lo[i] >= 0 else 0
            inside = int(self.level[j0:j1].max()) if j1 > j0 else 0
            out[i] = max(at_a, inside, 0)
        return out

    def max(self) -> int:
        """The largest count at any moment."""
        return int(max(self.level.max(), 0)) if len(self.level) else 0

    def mean(self, begin: float, end: float) -> float | None:
        """The mean count over ``[begin, end]`` (None for an empty span)."""
        if end <= begin:
            return None
        return float(self.means(np.array([begin]), np.array([end]))[0])


def in_flight(starts: array[float], ends: array[float], firsts: array[float], begin: float,
              span: float, series: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's requests in flight: ``{"mean", "max"}`` over the session (the mean over
    ``[begin, begin + span]``, the throughput rates' span), from each request's start, end
    and first token (its end without one). Each ``series`` point (``t`` seconds after
    ``begin``, over ``window_s``) gets ``in_flight_mean``, ``in_flight_max`` and
    ``waiting_mean`` over its window, in place."""
    s = np.frombuffer(starts, dtype=np.float64)
    flight = StepCount(s, np.frombuffer(ends, dtype=np.float64))
    waiting = StepCount(s, np.frombuffer(firsts, dtype=np.float64))
    if series:
        b = begin + np.array([float(p["t"]) for p in series])
        a = np.maximum(begin, b - np.array([float(p["window_s"]) for p in series]))
        means, maxima = flight.means(a, b), flight.maxima(a, b)
        waits = waiting.means(a, b)
        for i, p in enumerate(series):
            p["in_flight_mean"] = float(means[i])
            p["in_flight_max"] = int(maxima[i])
            p["waiting_mean"] = float(waits[i])
    return {"mean": flight.mean(begin, begin + span), "max": flight.max()}
