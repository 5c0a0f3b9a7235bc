"""engine_ttft_quantile follows PromQL's histogram_quantile; buckets_delta makes windows."""

from __future__ import annotations

import math

import pytest

from llmtop.engines import buckets_delta, engine_ttft_quantile

INF = math.inf
B = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0))


def test_interpolates_inside_the_bucket() -> None:
    # rank 20 of 40 → bucket (0.1, 0.5] holding 10..30 → 0.1 + 0.4 × 10/20
    assert engine_ttft_quantile(B, 0.5) == pytest.approx(0.3)
    assert engine_ttft_quantile(B, 1.0) == pytest.approx(1.0)


def test_first_bucket_starts_at_zero() -> None:
    # rank 4 of 40 in (0, 0.1] holding 10 → 0.04
    assert engine_ttft_quantile(B, 0.1) == pytest.approx(0.04)


def test_rank_in_inf_bucket_returns_highest_finite_bound() -> None:
    b = ((0.1, 10.0), (0.5, 30.0), (INF, 40.0))
    assert engine_ttft_quantile(b, 0.99) == 0.5


def test_order_of_input_does_not_matter_and_monotonic_fix() -> None:
    shuffled = (B[2], B[0], B[3], B[1])
    assert engine_ttft_quantile(shuffled, 0.5) == pytest.approx(0.3)
    # a non-monotonic count (scrape race) is lifted to its predecessor, as Prometheus does
    bumpy = ((0.1, 10.0), (0.5, 9.0), (1.0, 20.0), (INF, 20.0))
    assert engine_ttft_quantile(bumpy, 0.5) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "buckets", [(), ((0.1, 1.0),), ((0.1, 1.0), (0.5, 2.0)), ((0.1, 0.0), (INF, 0.0))]
)
def test_none_without_inf_bucket_or_observations(buckets: tuple[tuple[float, float], ...]) -> None:
    assert engine_ttft_quantile(buckets, 0.5) is None


def test_q_out_of_range() -> None:
    with pytest.raises(ValueError, match="q must be"):
        engine_ttft_quantile(B, 1.5)


def test_buckets_delta_window_and_reset() -> None:
    older = ((0.1, 5.0), (0.5, 10.0), (1.0, 10.0), (INF, 10.0))
    window = buckets_delta(B, older)
    assert window == ((0.1, 5.0), (0.5, 20.0), (1.0, 30.0), (INF, 30.0))
    # rank 15 of 30 in (0.1, 0.5] holding 5..20
    assert engine_ttft_quantile(window, 0.5) == pytest.approx(0.1 + 0.4 * (15 - 5) / 15)
    assert buckets_delta(older, B) == older  # counts went down: the engine restarted
    assert buckets_delta(B, ()) == B
    assert buckets_delta(B, ((0.2, 1.0), (INF, 1.0))) == B  # different bounds
