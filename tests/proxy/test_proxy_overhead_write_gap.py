"""benchmarks/proxy_overhead.py ``step_write_gap``: how far apart the paced engine writes a
decode step's chunks — the pace a proxy must keep per chunk not to fall behind within a
step (the benchmark prints it beside each proxy's CPU per chunk)."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from proxy_overhead import Result, merge_rounds, run_load, step_write_gap

from llmtop.sim.server import running_sim


def _steps(starts: list[float], n: int, gap: float) -> list[float]:
    return [s + i * gap for s in starts for i in range(n)]


def test_the_gap_inside_steps_not_between_them() -> None:
    # three steps 20 ms apart, each 50 writes 40 µs apart, given out of order
    times = _steps([1.0, 1.02, 1.04], 50, 40e-6)
    times.reverse()
    assert step_write_gap(times) == pytest.approx(40e-6)


def test_the_median_step_and_lone_writes_left_out() -> None:
    times = (_steps([1.0], 10, 10e-6) + _steps([1.02], 10, 30e-6)
             + _steps([1.04], 10, 50e-6) + [1.06, 1.08])  # two steps of one write
    assert step_write_gap(times) == pytest.approx(30e-6)


def test_nothing_to_tell() -> None:
    assert step_write_gap([]) is None
    assert step_write_gap([1.0, 1.5, 2.0]) is None  # one write a step: no gap inside one


def test_two_rounds_give_the_mean_gap() -> None:
    a, b = Result("direct", 4, write_gap_s=40e-6), Result("direct", 4, write_gap_s=60e-6)
    assert merge_rounds(a, b).write_gap_s == pytest.approx(50e-6)
    assert merge_rounds(a, Result("direct", 4)).write_gap_s == pytest.approx(40e-6)


async def test_a_paced_engine_writes_a_step_faster_than_its_steps() -> None:
    # the benchmark's paced engine: one decode step every 20 ms for every running sequence
    async with running_sim("tiny", seed=1, base_step_s=0.02, per_seq_s=0.0,
                           per_kv_token_s=0.0) as sim:
        phase = await run_load(sim.url, 16, 1.0, 8, False)
        async with aiohttp.ClientSession() as s, s.get(sim.url + "/sim/requests") as r:
            truth = {t["id"]: t for t in await r.json()}
    writes = [w for req in phase.results if req.rid in truth for w in truth[req.rid]["chunks"]]
    assert len(writes) >= 100 and phase.errors == 0
    gap = step_write_gap(writes)
    # 16 streams' chunks written in turn: far closer together than the 20 ms between steps
    assert gap is not None and 0 < gap < 0.003
