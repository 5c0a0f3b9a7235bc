"""benchmarks/proxy_overhead.py splits a phase's RSS into memory per open stream and the
growth of kept history (``split_rss``): the figures it reports must come out of the
samples, whatever their mix."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from proxy_overhead import split_rss


@pytest.mark.parametrize(("per_stream", "growth"), [(50.0, 100.0), (20.0, 0.0), (80.0, 350.0)])
def test_per_stream_and_growth_come_apart(per_stream: float, growth: float) -> None:
    rng = random.Random(3)
    idle, n = 60_000, 64
    samples = [(0.0, idle)]  # the first sample, before the streams opened
    samples += [(t / 5, round(idle + n * per_stream + growth * t / 5 + rng.uniform(-8, 8)))
                for t in range(1, 26)]
    got, slope = split_rss(samples, idle, n, ramp_s=1.0)
    assert got == pytest.approx(per_stream, abs=0.5)
    assert slope is not None and slope == pytest.approx(growth, abs=5)


def test_a_short_phase_falls_back_to_the_peak() -> None:
    got, slope = split_rss([(0.0, 1000), (0.2, 1640), (0.4, 1600)], 1000, 10, ramp_s=1.0)
    assert (got, slope) == (64.0, None)


def test_shrinking_memory_is_no_negative_growth() -> None:
    samples = [(t / 5, 2000 - 10 * t) for t in range(10)]
    got, slope = split_rss(samples, 1000, 10, ramp_s=0.5)
    assert slope == 0.0 and got == pytest.approx((sum(r for t, r in samples if t >= 0.5)
                                                  / len([1 for t, _ in samples if t >= 0.5])
                                                  - 1000) / 10)


def test_rounds_pool_samples_and_weight_cpu_by_chunks() -> None:
    """``--rounds``: the CPU per chunk of two rounds is their chunk-weighted mean (it was
    the first round's alone), samples are pooled, RSS figures are the first round's (a
    later one also carries what earlier rounds left behind)."""
    from proxy_overhead import Result, merge_rounds

    a = Result("llmtop", 64, requests=10, chunks=1000, coalesced=2, ttft_over=[0.001],
               chunk_delay=[0.002, 0.003], cpu_us_per_chunk=60.0, rss_kib_per_stream=40.0,
               chunks_per_s=500.0)
    b = Result("llmtop", 64, requests=30, chunks=3000, coalesced=1, ttft_over=[0.004],
               chunk_delay=[0.005], cpu_us_per_chunk=80.0, rss_kib_per_stream=35.0,
               rss_growth_kib_s=3.0, chunks_per_s=1000.0)
    m = merge_rounds(a, b)
    assert (m.requests, m.chunks, m.coalesced) == (40, 4000, 3)
    assert m.cpu_us_per_chunk == pytest.approx(75.0)  # (60*1000 + 80*3000) / 4000
    assert m.ttft_over == [0.001, 0.004] and m.chunk_delay == [0.002, 0.003, 0.005]
    assert m.rss_kib_per_stream == 40.0 and m.rss_growth_kib_s is None
    assert m.chunks_per_s == pytest.approx(4000 / (2.0 + 3.0))
    assert merge_rounds(a, Result("llmtop", 64)).cpu_us_per_chunk is None  # one unknown


def test_scale_cells_of_several_rounds_add_up() -> None:
    from proxy_overhead import Result
    from scale_overhead import Cell, _merge_cells

    a = Cell(Result("llmtop-1w+poll", 64, chunks=1000, cpu_us_per_chunk=60.0), 8.0,
             {11: 0.05, 12: 0.01}, polls=16, ticks=80)
    b = Cell(Result("llmtop-1w+poll", 64, chunks=1000, cpu_us_per_chunk=70.0), 8.5,
             {11: 0.06, 12: 0.02}, polls=17, ticks=82)
    m = _merge_cells(a, b)
    assert m.res.chunks == 2000 and m.wall_s == 16.5
    assert m.cpu_by_pid == pytest.approx({11: 0.11, 12: 0.03})
    assert (m.polls, m.ticks) == (33, 162)
    assert m.cpu_split() == [55.0, 15.0]


def test_a_level_reports_the_settling_phases_rss() -> None:
    from proxy_overhead import Result, with_rss_of

    timed = Result("llmtop", 256, chunks=900, cpu_us_per_chunk=60.0, rss_kib_per_stream=2.0)
    cold = Result("llmtop", 256, chunks=100, cpu_us_per_chunk=90.0, rss_kib_per_stream=30.0,
                  rss_growth_kib_s=400.0, rss_peak_kib_per_stream=41.0)
    got = with_rss_of(timed, cold)
    assert (got.rss_kib_per_stream, got.rss_growth_kib_s, got.rss_peak_kib_per_stream) == (
        30.0, 400.0, 41.0)
    assert got.chunks == 900 and got.cpu_us_per_chunk == 60.0  # the timed rounds' own
