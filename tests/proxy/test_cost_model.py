"""benchmarks/cost_model.py: a proxy's CPU per request and per chunk, solved from two phases
of different answer lengths, gives back the costs the phases were made of."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cost_model import Phase, pooled, solve


@pytest.mark.parametrize(("per_request_us", "per_chunk_us"), [(195.0, 30.2), (55.0, 25.7),
                                                               (0.0, 12.0)])
def test_the_costs_come_back(per_request_us: float, per_chunk_us: float) -> None:
    def phase(requests: int, tokens: int) -> Phase:
        chunks = requests * tokens
        return Phase(requests, chunks, (requests * per_request_us + chunks * per_chunk_us) / 1e6)

    got = solve(phase(2304, 32), phase(9437, 8))
    assert got is not None
    assert got == pytest.approx((per_request_us, per_chunk_us), rel=1e-9, abs=1e-9)


def test_one_proportion_has_no_answer() -> None:
    assert solve(Phase(100, 3200, 0.4), Phase(50, 1600, 0.2)) is None


def test_rounds_pool_by_sum() -> None:
    assert pooled([Phase(1, 32, 0.5), Phase(2, 40, 0.25)]) == Phase(3, 72, 0.75)
