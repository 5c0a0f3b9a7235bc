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
