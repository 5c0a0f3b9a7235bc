"""Capacity search: the largest load level whose SLO attainment holds the target.

A sweep runs the given levels, then keeps doubling (ending with ``max_level`` itself; no
level above it is ever run) until a level fails, then bisects between the last passing and
the first failing level (integers for concurrency; for rates, until the two are within
``rate_resolution`` req/s or :data:`RATE_RELATIVE` of the failing rate, whichever is
wider). A closed-loop level that its ``--requests`` cannot fill (:func:`unreached`) and
that met the SLOs at the lower concurrency it had ends the sweep as ``max_level`` does;
an open-loop level that saw no arrival (:func:`sent_nothing`) neither passes nor fails:
the sweep goes on past it, a bisection stops there. A
level "passes" when its attainment ≥ target, it had no more errors than
``max_error_rate`` and (open loop) it sent every arrival: one it could not send, as too
many requests were open already, is a request its figures leave out.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from llmtop.bench.summary import StepSummary

RunLevel = Callable[[float], Awaitable[StepSummary]]
RATE_RESOLUTION: Final = 0.25
"""How finely a search over rates bisects, in requests per second (at the least)."""
RATE_RELATIVE: Final = 0.05
"""… and relative to the failing rate: between 512 and 1,024 req/s a search stopped only
within 0.25 req/s (11 bisections, each a whole level's run) for a figure that one run's
noise moves by more than 5 %; it now stops within 51 req/s (4)."""


def _settled(lo: float, hi: float, rate_resolution: float) -> bool:
    """A rate bisection between ``lo`` (passed) and ``hi`` (failed) is done."""
    return hi - lo <= max(rate_resolution, RATE_RELATIVE * hi)


@dataclass
class SearchResult:
    steps: list[StepSummary]
    best: StepSummary | None
    first_fail: StepSummary | None

    def ordered(self) -> list[StepSummary]:
        return sorted(self.steps, key=lambda s: s.level)


def unreached(s: StepSummary) -> bool:
    """A closed-loop level that never had its concurrency open (``--requests`` fewer than
    the level): it measured a lower one. Failing there, it fails (more load would not
    do better); meeting the SLOs there, it does not pass (see :func:`not_counted`)."""
    peak = s.peak_open
    return peak is not None and 0 < peak < s.level  # (set in closed loop only)


def sent_nothing(s: StepSummary) -> bool:
    """An open-loop level that saw no arrival in its window (a low rate, a short
    duration): it measured nothing, so it neither passes nor fails. (An open loop files
    every measured arrival it sent, or cuts it off, or counts it as overflow.)"""
    return (s.mode == "rate" and s.requests == 0 and not s.overflow and not s.cut_off
            and not s.gave_up)


def _meets(s: StepSummary, target: float, max_error_rate: float) -> bool:
    if s.requests == 0 or s.slo_attainment is None or s.overflow:
        return False
    errors = (s.errors + s.timeouts) / s.requests
    return s.slo_attainment >= target and errors <= max_error_rate


def passes(s: StepSummary, target: float, max_error_rate: float = 0.0) -> bool:
    return _meets(s, target, max_error_rate) and not unreached(s)


def not_counted(s: StepSummary, target: float, max_error_rate: float = 0.0) -> bool:
    """A level that neither passes nor fails: it sent nothing (:func:`sent_nothing`), or
    met the SLOs at a lower concurrency than its own (:func:`unreached`)."""
    return sent_nothing(s) or (unreached(s) and _meets(s, target, max_error_rate))


def _sweep(start_levels: Sequence[float], ceiling: float) -> list[float]:
    """Every level a sweep that never fails runs: the given ones up to ``ceiling``, then
    doublings up to it (as :func:`search` makes them)."""
    levels = [lv for lv in start_levels if lv <= ceiling]
    while True:
        level = min((levels[-1] * 2) if levels else 1.0, ceiling)
        if level <= 0 or (levels and level <= levels[-1]):
            return levels
        levels.append(level)


def most_levels(start_levels: Sequence[float], *, integer: bool, max_level: float,
                rate_resolution: float = RATE_RESOLUTION) -> int:
    """The most levels :func:`search` can run from these arguments, whatever the results:
    the sweep up to ``max_level`` and, after a failure, the longest bisection (between
    the failing level and the one before it) — for ``--max-duration``'s check of a plan.
    (A search from 1 to 1,024 in concurrency runs up to 11 levels and 9 bisections.)"""
    levels = _sweep(start_levels, float(int(max_level)) if integer else max_level)
    most = len(levels)  # nothing failed
    lo = 0.0
    for k, hi in enumerate(levels):
        gap, halvings = hi - lo, 0
        if integer:
            while gap > 1:
                gap = math.ceil(gap / 2)
                halvings += 1
        else:  # the longest: each middle fails (the failed rate, so the 5 %, goes down)
            while not _settled(lo, lo + gap, rate_resolution):
                gap /= 2
                halvings += 1
        most = max(most, k + 1 + halvings)
        lo = hi
    return most


def most_seconds(start_levels: Sequence[float], *, max_level: float,
                 level_s: Callable[[float], float],
                 rate_resolution: float = RATE_RESOLUTION) -> float:
    """The longest a rate search (levels in requests/s, not whole numbers) from these
    arguments can run, whatever the results, when a level at rate ``r`` takes
    ``level_s(r)`` seconds (``--requests N``: N / r, longer the lower the rate): the
    sweep up to each level and, after that level fails, the bisection whose middles all
    fail — each lower than the one before, so the slowest. (Counting levels times the
    slowest given level, a search from 1 req/s that fails there read 300 s for 700.)"""
    levels = _sweep(start_levels, max_level)
    swept = most = 0.0
    lo = 0.0
    for hi in levels:
        swept += level_s(hi)
        t, top = swept, hi
        while not _settled(lo, top, rate_resolution):
            mid = (lo + top) / 2
            if mid <= 0:
                break
            t += level_s(mid)
            top = mid
        most = max(most, t)
        lo = hi
    return most


async def search(
    run_level: RunLevel,
    *,
    integer: bool,
    start_levels: Sequence[float],
    target: float,
    max_level: float,
    rate_resolution: float = RATE_RESOLUTION,
    max_error_rate: float = 0.0,
) -> SearchResult:
    steps: list[StepSummary] = []
    best: StepSummary | None = None
    fail: StepSummary | None = None
    ceiling = float(int(max_level)) if integer else max_level
    levels = [lv for lv in start_levels if lv <= ceiling]
    # 1. sweep: the given levels, then keep doubling until something fails
    i = 0
    while fail is None:
        if i < len(levels):
            level = levels[i]
        else:
            level = min((levels[-1] * 2) if levels else 1.0, ceiling)
            if level <= 0 or (levels and level <= levels[-1]):
                break
            levels.append(level)
        i += 1
        s = await run_level(level)
        steps.append(s)
        if sent_nothing(s):  # (no evidence: a higher rate fills the window)
            continue
        if not_counted(s, target, max_error_rate):  # (--requests fewer than the level: no
            break  # higher level is reached either)
        if passes(s, target, max_error_rate):
            best = s if best is None or s.level > best.level else best
        else:
            fail = s
    if fail is None:
        return SearchResult(steps, best, None)
    # 2. bisect between the best passing level below the failure and the failure
    lo = max((s.level for s in steps if passes(s, target, max_error_rate)
              and s.level < fail.level), default=0.0)
    hi = fail.level
    while True:
        if integer:
            if hi - lo <= 1:
                break
            mid = float(int((lo + hi) // 2))
        else:
            if _settled(lo, hi, rate_resolution):
                break
            mid = (lo + hi) / 2
        if mid <= 0:
            break
        s = await run_level(mid)
        steps.append(s)
        if not_counted(s, target, max_error_rate):  # (nothing to narrow the bounds by)
            break
        if passes(s, target, max_error_rate):
            lo = mid
            if best is None or s.level > best.level:
                best = s
        else:
            hi = mid
            fail = s if s.level < fail.level else fail
    return SearchResult(steps, best, fail)
