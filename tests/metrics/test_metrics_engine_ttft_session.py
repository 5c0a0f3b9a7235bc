"""The engine's TTFT P95 over the whole session ("all") is the engine's histogram since
the session's first reading, as every other window's is since that window's start: it
took all of the engine's counts, so an engine that had served a thousand slow requests
before llmtop started read their P95 in "all" while the session's own requests were all
fast (and the 300 s window, once the session was younger than it, read the session's)."""

from __future__ import annotations

import math

import pytest
from metrics_records import Clock

from llmtop.config import Config
from llmtop.events import EngineReading
from llmtop.metrics.aggregator import Aggregator


def reading(t: float, fast: float, slow: float) -> EngineReading:
    """Cumulative buckets: ``fast`` requests under 0.1 s, ``slow`` ones in (1, 10] s."""
    total = fast + slow
    return EngineReading(t=t, kind="vllm", running=0.0, waiting=0.0,
                         ttft_buckets=((0.1, fast), (1.0, fast), (10.0, total),
                                       (math.inf, total)))


def test_all_counts_from_the_sessions_first_reading() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([reading(clock.t, 0, 1000)])  # a thousand slow ones before the start
    for i in range(1, 41):  # 400 s of scrapes (the history keeps 320 s), 100 fast ones
        clock.advance(10.0)
        agg.on_events([reading(clock.t, 2.5 * i, 1000)])
    # the session's 100 requests, all under 0.1 s: rank 95 of 100 in (0, 0.1]
    assert agg.snapshot(None)["engine"]["ttft_p95"] == pytest.approx(0.095)
    # the sliding windows unchanged: the last 60 s held 15 fast ones
    assert agg.snapshot(60)["engine"]["ttft_p95"] == pytest.approx(0.095)


def test_a_single_reading_reads_the_engines_own_counts() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([reading(clock.t, 10, 10)])  # nothing to count from: all it holds
    p95 = agg.snapshot(None)["engine"]["ttft_p95"]
    assert p95 is not None and 1.0 < p95 <= 10.0
