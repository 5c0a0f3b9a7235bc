"""Capacity at SLO from requests binned by their concurrency at start."""

from __future__ import annotations

import pytest
from metrics_records import Clock, record

from llmtop.config import Config, SloConfig
from llmtop.events import RequestRecord
from llmtop.metrics import capacity
from llmtop.metrics.aggregator import Aggregator


def feed(agg: Aggregator, clock: Clock, recs: list[RequestRecord]) -> None:
    clock.advance(1.0)
    agg.on_events(recs)


def knee_traffic(levels: range, n: int, fail_share: dict[int, float]) -> list[RequestRecord]:
    """``n`` requests per concurrency level; TTFT grows with concurrency past 5."""
    out = []
    for c in levels:
        bad = round(n * fail_share.get(c, 0.0))
        for i in range(n):
            ttft = 0.9 if (c > 5 or i < bad) else 0.05 * c
            out.append(record(ttft=ttft, gaps=[0.02] * 9, concurrency=c))
    return out


def test_null_until_a_bin_has_enough_requests() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    feed(agg, clock, knee_traffic(range(1, 4), capacity.MIN_REQUESTS_PER_BIN - 1, {}))
    cap = agg.snapshot(60)["capacity"]
    assert cap["max_concurrency_at_slo"] is None
    assert cap["goodput_tps_at_slo"] is None
    assert cap["min_requests_per_bin"] == 20
    feed(agg, clock, [record(ttft=0.05, concurrency=2)])
    assert agg.snapshot(60)["capacity"]["max_concurrency_at_slo"] == 2


def test_known_knee_is_found_and_goodput_there_follows_littles_law() -> None:
    clock = Clock()
    agg = Aggregator(Config(slo=SloConfig(ttft_s=0.5, itl_p95_s=0.05, target=0.95)),
                     clock=clock)
    # level 5 misses 2 of 50 (96% ≥ 95%), level 6 and up miss everything
    recs = knee_traffic(range(1, 13), 50, {5: 0.04})
    feed(agg, clock, recs)
    cap = agg.snapshot(None)["capacity"]
    assert cap["max_concurrency_at_slo"] == 5
    assert cap["first_failing_concurrency"] == 6
    at5 = [r for r in recs if r.concurrency_at_start == 5]
    good = [r for r in at5 if r.ttft_s is not None and r.ttft_s <= 0.5]
    tokens = sum(r.completion_tokens or 0 for r in good)
    e2e = sum(r.e2e_s for r in at5)
    assert cap["goodput_tps_at_slo"] == pytest.approx(5 * tokens / e2e)
    assert cap["goodput_rps_at_slo"] == pytest.approx(5 * len(good) / e2e)
    assert cap["attainment_at_slo"] == pytest.approx(48 / 50)
    assert [b["concurrency"] for b in cap["bins"]] == list(range(1, 13))


def test_a_lucky_bin_past_the_knee_does_not_raise_capacity() -> None:
    bins = [
        {"concurrency": c, "requests": 40, "met": 40 if c in (1, 2, 3, 9) else 10,
         "good_tokens": 400.0, "e2e_sum_s": 40.0}
        for c in range(1, 11)
    ]
    bins.append({"concurrency": 0, "requests": 5, "met": 0, "good_tokens": 0.0,
                 "e2e_sum_s": 5.0})  # too few to count or to stop the walk
    est = capacity.estimate(bins, 0.95)
    assert est["max_concurrency_at_slo"] == 3
    assert est["first_failing_concurrency"] == 4
    assert est["goodput_tps_at_slo"] == pytest.approx(3 * 400 / 40)


def test_zero_when_even_the_lowest_level_misses() -> None:
    bins = [{"concurrency": 1, "requests": 30, "met": 3, "good_tokens": 30.0,
             "e2e_sum_s": 30.0}]
    est = capacity.estimate(bins, 0.95)
    assert est["max_concurrency_at_slo"] == 0
    assert est["goodput_tps_at_slo"] == 0.0


def test_not_zero_when_lower_levels_were_seen_but_are_short_of_requests() -> None:
    """A load ramp's first pass: levels 1..13 were visited (a few requests each, all within
    the SLOs), then 14 collected enough requests and failed. The capacity is below 14, not
    0 ("the SLOs are not met at any load" would be false); it stays unknown until a lower
    level qualifies."""
    low = [{"concurrency": c, "requests": 5, "met": 5, "good_tokens": 50.0, "e2e_sum_s": 5.0,
            "judged": 5} for c in range(1, 14)]
    failing = {"concurrency": 14, "requests": 30, "met": 3, "good_tokens": 30.0,
               "e2e_sum_s": 60.0, "judged": 30}
    est = capacity.estimate([*low, failing], 0.95)
    assert est["max_concurrency_at_slo"] is None and est["first_failing_concurrency"] == 14
    assert est["goodput_tps_at_slo"] is None
    # cancels on track (nothing judged) below do not count as levels seen
    unjudged = [dict(b, judged=0, met=0) for b in low]
    assert capacity.estimate([*unjudged, failing], 0.95)["max_concurrency_at_slo"] == 0
    # the array estimate says the same
    import numpy as np

    bins = capacity.CapacityBins()
    conc = np.array([c for c in range(1, 14) for _ in range(5)] + [14] * 30, dtype=np.int64)
    met = np.array([True] * 65 + [True] * 3 + [False] * 27)
    bins.add(conc, met, np.ones(len(conc)), np.ones(len(conc)))
    est = bins.estimate(0.95, with_bins=False)
    assert est["max_concurrency_at_slo"] is None and est["first_failing_concurrency"] == 14


def test_bins_merge_by_concurrency() -> None:
    a = [{"concurrency": 1, "requests": 10, "met": 10, "good_tokens": 100.0, "e2e_sum_s": 5.0}]
    b = [{"concurrency": 1, "requests": 15, "met": 14, "good_tokens": 90.0, "e2e_sum_s": 7.0},
         {"concurrency": 2, "requests": 3, "met": 0, "good_tokens": 0.0, "e2e_sum_s": 3.0}]
    m = capacity.merge_bins([a, b])
    assert m == [  # bins without a judged count (an older llmtop's) judge every request
        {"concurrency": 1, "requests": 25, "met": 24, "good_tokens": 190.0, "e2e_sum_s": 12.0,
         "judged": 25},
        {"concurrency": 2, "requests": 3, "met": 0, "good_tokens": 0.0, "e2e_sum_s": 3.0,
         "judged": 3},
    ]
    assert capacity.estimate(m, 0.95)["max_concurrency_at_slo"] == 1


def test_attainment_per_bin_is_over_judged_requests() -> None:
    """Requests cancelled on track (not judged) neither fail a bin nor qualify it."""
    on_track_cancels = {"concurrency": 2, "requests": 24, "met": 20, "good_tokens": 200.0,
                        "e2e_sum_s": 24.0, "judged": 20}
    low = {"concurrency": 1, "requests": 30, "met": 30, "good_tokens": 300.0,
           "e2e_sum_s": 30.0, "judged": 30}
    est = capacity.estimate([low, on_track_cancels], 0.95)
    assert est["max_concurrency_at_slo"] == 2  # 20/20, though only 20 of 24 met
    assert est["attainment_at_slo"] == 1.0
    few_judged = dict(on_track_cancels, concurrency=3, met=10, judged=12)  # 12 < 20: skipped
    est = capacity.estimate([low, on_track_cancels, few_judged], 0.95)
    assert est["max_concurrency_at_slo"] == 2 and est["first_failing_concurrency"] is None
    merged = capacity.merge_bins([[on_track_cancels], [dict(low, concurrency=2)]])
    assert merged[0]["judged"] == 50 and merged[0]["requests"] == 54


def test_the_array_estimate_equals_the_estimate_over_bin_dicts() -> None:
    """A live snapshot without bins computes the capacity section on the arrays; it must
    say exactly what the estimate over the bin dicts (what merges use) says."""
    import numpy as np

    rng = np.random.default_rng(7)
    for trial in range(300):
        bins = capacity.CapacityBins()
        n = int(rng.integers(0, 400))
        conc = rng.integers(0, int(rng.integers(1, 80)), n)
        bad_from = int(rng.integers(0, 90))
        met = (rng.random(n) < np.where(conc >= bad_from, 0.5, 0.99))
        judged = met | (rng.random(n) < 0.8)  # a met request is always judged
        bins.add(conc.astype(np.int64), met, rng.integers(1, 50, n).astype(np.float64),
                 rng.random(n) * 3, judged)
        target = float(rng.choice([0.5, 0.9, 0.95, 0.99]))
        want = capacity.estimate(bins.bins(), target)
        del want["bins"]
        assert bins.estimate(target, with_bins=False) == want, trial
        assert bins.estimate(target)["bins"] == bins.bins()


def test_an_outage_does_not_enter_the_capacity_bins() -> None:
    """The proxy's own fast 502s while the engine is down (QA: "max concurrency at SLO ≈ 0"
    stayed on screen 30 s after the engine was back) are not answers under load; an
    engine's own 502 or 503 still is."""
    import dataclasses

    clock = Clock()
    agg = Aggregator(Config(slo=SloConfig(ttft_s=0.5, itl_p95_s=0.05, target=0.95)),
                     clock=clock)
    feed(agg, clock, knee_traffic(range(1, 5), 30, {}))
    down = [dataclasses.replace(record(ttft=None, outcome="error", concurrency=c),
                                status=502, error="upstream unreachable: connection refused")
            for c in range(1, 9) for _ in range(30)]
    feed(agg, clock, down)
    cap = agg.snapshot(None)["capacity"]
    assert cap["max_concurrency_at_slo"] == 4
    assert sum(b["requests"] for b in cap["bins"]) == 4 * 30
    overloaded = [dataclasses.replace(r, error="upstream answered HTTP 502") for r in down]
    feed(agg, clock, overloaded)  # the engine's own 502s: they count, and fail
    cap = agg.snapshot(None)["capacity"]
    assert cap["max_concurrency_at_slo"] is None or cap["max_concurrency_at_slo"] < 4
