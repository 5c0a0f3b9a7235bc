"""The time series' first point divides by at least a second, as the snapshot's rates do:
an aggregator started 10 ms before a 2 s boundary gave its first interval a span of 10 ms,
so one 10-token request in it plotted 100 req/s and 1,000 tok/s (the snapshot of the same
moment read 1 req/s), and the plots' scale was set by that spike for five minutes."""

from __future__ import annotations

import pytest
from metrics_records import T0, Clock, record

from llmtop.config import Config
from llmtop.metrics.aggregator import Aggregator


def test_a_first_interval_of_ten_ms_reads_per_second_not_per_ten_ms() -> None:
    clock = Clock(T0 + 1.99)  # T0 is on the 2 s grid: the first interval ends in 10 ms
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([record()])  # 10 output tokens, 10 input tokens
    clock.advance(0.5)
    agg.tick()
    first = agg.series[0]
    assert first["t"] == T0 + 2.0
    assert first["requests"] == 1
    assert first["rps"] == pytest.approx(1.0)
    assert first["output_tps"] == pytest.approx(10.0)
    assert first["input_tps"] == pytest.approx(10.0)
    assert first["goodput_tps"] == pytest.approx(10.0)
    assert agg.snapshot(10)["system"]["rps"] == pytest.approx(first["rps"])


def test_a_first_interval_over_a_second_keeps_its_own_span() -> None:
    clock = Clock(T0 + 0.5)  # 1.5 s to the boundary
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([record()])
    clock.advance(2.0)
    agg.tick()
    assert agg.series[0]["rps"] == pytest.approx(1 / 1.5)
    assert agg.series[0]["output_tps"] == pytest.approx(10 / 1.5)
