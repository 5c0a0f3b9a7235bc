"""``most_levels``: the most levels a ``--search`` can run, which ``--max-duration`` checks
a plan against. It counted the given levels plus 12; a search from 1 to 1,024 can run 20
(22 over rates), so a search could run past the limit it had been allowed."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from llmtop.bench.search import most_levels, most_seconds, search


def step(level: float, slo_attainment: float) -> Any:
    """What search reads of a level's StepSummary (a closed-loop level that had its
    concurrency open)."""
    return SimpleNamespace(level=level, requests=10, errors=0, timeouts=0, overflow=0,
                           slo_attainment=slo_attainment, mode="concurrency",
                           peak_open=None, cut_off=0, gave_up=False)


async def levels_run(threshold: float, *, integer: bool, start: list[float],
                     max_level: float) -> int:
    """How many levels search runs when every level up to ``threshold`` passes."""
    async def run_level(level: float) -> Any:
        ok = level <= threshold
        return step(level, slo_attainment=1.0 if ok else 0.0)

    result = await search(run_level, integer=integer, start_levels=start, target=0.95,
                          max_level=max_level)
    return len(result.steps)


@pytest.mark.parametrize(("start", "max_level"), [
    ([1.0, 2.0, 4.0, 8.0], 1024.0), ([1.0], 4096.0), ([3.0, 5.0], 100.0), ([4.0], 4.0),
])
async def test_most_levels_bounds_every_concurrency_search(start: list[float],
                                                           max_level: float) -> None:
    runs = [await levels_run(t, integer=True, start=start, max_level=max_level)
            for t in range(int(max_level) + 1)]
    assert max(runs) == most_levels(start, integer=True, max_level=max_level)


@pytest.mark.parametrize(("start", "max_level"), [([1.0, 2.0, 4.0, 8.0], 1024.0),
                                                  ([0.5], 10_000.0), ([2.0, 3.0], 7.5)])
async def test_most_levels_bounds_every_rate_search(start: list[float],
                                                    max_level: float) -> None:
    rng = random.Random(1)
    thresholds = [0.0, max_level, *(rng.uniform(0, max_level) for _ in range(1500)),
                  *(rng.uniform(0, 2) for _ in range(500))]
    runs = [await levels_run(t, integer=False, start=start, max_level=max_level)
            for t in thresholds]
    most = most_levels(start, integer=False, max_level=max_level)
    assert max(runs) <= most
    assert max(runs) >= most - 1  # (sampled thresholds: the worst one may be missed by one)


def test_the_default_search_is_20_levels_not_16() -> None:
    assert most_levels([1.0, 2.0, 4.0, 8.0], integer=True, max_level=1024.0) == 20


def test_max_duration_counts_a_searchs_every_level() -> None:
    """20 levels of 160 s plus 5 s of warm-up is 3,300 s: over 3,200 (16 levels made
    2,640 s, and the plan was taken)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "llmtop", "bench", "http://127.0.0.1:9",
                        "--search", "--duration", "160", "--max-duration", "3200"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "llmtop bench: error: this plan could run 3300 s, over --max-duration 3200 s; "
        "shorten --duration or raise --max-duration"]


async def test_a_rate_search_stops_within_five_percent_of_the_failing_rate() -> None:
    """Between 512 req/s (passed) and 1,024 (failed) a search bisected to within 0.25
    req/s: 11 more levels, each a whole run, for a figure one run's noise moves by more
    than 5 %. It now stops once the two are within 5 % of the failing rate (and 0.25 req/s
    at low rates)."""
    tried: list[float] = []

    async def run_level(level: float) -> Any:
        tried.append(level)
        ok = level <= 700.0
        return step(level, slo_attainment=1.0 if ok else 0.0)

    result = await search(run_level, integer=False, start_levels=[512.0, 1024.0],
                          target=0.95, max_level=1024.0)
    assert tried[:2] == [512.0, 1024.0]
    assert tried[2:] == [768.0, 640.0, 704.0, 672.0]  # 672 → 704: 32 ≤ 5 % of 704
    assert result.best is not None and result.best.level == 672.0
    assert result.first_fail is not None and result.first_fail.level == 704.0
    assert len(tried) <= most_levels([512.0, 1024.0], integer=False, max_level=1024.0)

    slow: list[float] = []

    async def low_level(level: float) -> Any:  # a limit of 1.3 req/s: 0.25 is over 5 %
        slow.append(level)
        return step(level, slo_attainment=1.0 if level <= 1.3 else 0.0)

    low = await search(low_level, integer=False, start_levels=[1.0, 2.0], target=0.95,
                       max_level=2.0)
    assert slow == [1.0, 2.0, 1.5, 1.25]
    assert low.first_fail is not None and low.first_fail.level == 1.5


@pytest.mark.parametrize(("start", "max_level", "fail_above"), [
    ([1.0], 1.0, 0.0), ([1.0], 1.0, 0.6), ([1.0, 2.0], 8.0, 0.0), ([1.0, 2.0], 8.0, 3.0),
    ([0.5], 16.0, 100.0), ([4.0], 64.0, 0.3), ([2.0, 3.0], 10.0, 2.5),
])
async def test_most_seconds_bounds_a_rate_searchs_time(start: list[float], max_level: float,
                                                       fail_above: float) -> None:
    """``--requests 100`` at rate r takes 100 / r s: whatever fails, the search's levels
    take no longer than most_seconds says; failing at once, exactly that long (the
    bisection's middles go down, each slower than the one before)."""
    tried: list[float] = []

    async def run_level(level: float) -> Any:
        tried.append(level)
        return step(level, slo_attainment=1.0 if level <= fail_above else 0.0)

    def level_s(rate: float) -> float:
        return 100.0 / rate

    await search(run_level, integer=False, start_levels=start, target=0.95,
                 max_level=max_level)
    bound = most_seconds(start, max_level=max_level, level_s=level_s)
    assert sum(map(level_s, tried)) <= bound + 1e-9
    if fail_above == 0.0:
        assert sum(map(level_s, tried)) == pytest.approx(bound)


def test_max_duration_counts_a_rate_searchs_slower_middles() -> None:
    """From 1 req/s, failing there, a search of 100 requests a level runs 1, 0.5 and 0.25
    req/s: 100 + 200 + 400 s. The check counted three levels of the given one's 100 s
    (300 s) and took the plan under --max-duration 500."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "llmtop", "bench", "http://127.0.0.1:9",
                        "--rate", "1", "--search", "--max-level", "1", "--requests", "100",
                        "--max-duration", "500"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "llmtop bench: error: this plan could run 700 s, over --max-duration 500 s; "
        "lower --requests, raise --rate or raise --max-duration"]
