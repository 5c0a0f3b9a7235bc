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


def test_a_proxy_that_measures_nothing_fails_the_run() -> None:
    """llmtop answering every request 413 (a 1-byte body limit; neither the simulator nor
    the splice reads it): before, its row read n/a and the run exited 0. Now it reads
    FAILED with the status line the load generator saw, and the run exits 3; the splice
    keeps its figures. (A subprocess: the benchmark pins its own process's CPUs.)"""
    import os
    import subprocess

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("cost_model needs 2 CPUs")
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "cost_model.py"
    p = subprocess.run(
        [sys.executable, str(bench), "--streams", "2", "--duration", "0.3", "--rounds", "1",
         "--long", "4", "--short", "2", "--no-nginx"],
        env={**os.environ, "LLMTOP_MAX_BODY_BYTES": "1"}, capture_output=True, text=True,
        timeout=180, check=False, stdin=subprocess.DEVNULL)
    assert p.returncode == 3, p.stdout + p.stderr
    said = [ln for ln in p.stderr.splitlines() if "llmtop (forwarding process) FAILED" in ln]
    assert said and "HTTP/1.1 413" in said[0], p.stderr
    rows = {ln.split()[0]: ln for ln in p.stdout.splitlines()
            if ln.startswith(("llmtop", "splice"))}
    assert "FAILED" in rows["llmtop"] and "FAILED" not in rows["splice"], p.stdout
