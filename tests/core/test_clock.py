"""llmtop's clock (:mod:`llmtop.clock`): unix seconds on a monotonic timeline, immune to
steps of the system clock (QA saw an NTP step of 21.4 s take the 10 s tok/s from ~12k to
835), and one timeline for the coordinator and its workers."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest

from llmtop import clock
from llmtop.config import load_config
from llmtop.engines.scraper import EngineScraper
from llmtop.gpu.sampler import GpuSampler
from llmtop.gpu.simsource import SimGpuSource
from llmtop.metrics.aggregator import Aggregator
from llmtop.worker_procs import WorkerLauncher


class SteppingWall:
    """A stand-in for ``time.time``: the real wall clock plus an offset a test steps."""

    def __init__(self) -> None:
        self.real = time.time
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset


def test_unix_now_is_unix_time_when_the_wall_clock_is_left_alone() -> None:
    before = time.time()
    now = clock.unix_now()
    after = time.time()
    # the anchor was taken at import: only drift since then separates the two
    assert before - 0.05 <= now <= after + 0.05


def test_unix_now_stays_monotonic_and_continuous_through_wall_clock_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = SteppingWall()
    monkeypatch.setattr(time, "time", wall)
    # (perf_counter before, llmtop's clock, perf_counter after): llmtop's reading lies
    # between the two, wherever the process was held (a reading paired with one perf read,
    # 5 ms apart at most, failed when the machine paused the test between the two calls)
    seen: list[tuple[float, float, float]] = []
    for step in (0.0, +30.0, -30.0, -30.0, +30.0):
        wall.offset += step
        for _ in range(200):
            seen.append((time.perf_counter(), clock.unix_now(), time.perf_counter()))
        time.sleep(0.01)
    assert wall.offset == 0.0 and time.time is wall  # the steps did happen
    llm = [s[1] for s in seen]
    assert all(b >= a for a, b in pairwise(llm)), "went backwards"
    # every gap is the monotonic time that passed: no 30 s jump anywhere (1 µs: floats of
    # unix seconds)
    for (pa0, a, pa1), (pb0, b, pb1) in [*pairwise(seen), (seen[0], seen[-1])]:
        assert pb0 - pa1 - 1e-6 <= b - a <= pb1 - pa0 + 1e-6


def test_a_fresh_anchor_taken_during_a_step_moves_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = SteppingWall()
    monkeypatch.setattr(time, "time", wall)
    wall.offset = 30.0
    # each reading between two reads of what it must lie between, wherever the test was
    # held (approx(abs=0.05) around one read failed on a pause of the test in between);
    # an anchor's offset: unix seconds minus perf_counter seconds
    w0 = wall()
    a = clock.take_anchor(wall=wall)
    w1 = wall()
    assert w0 <= a.wall <= w1
    prev = clock.anchor()
    step = (a.wall - a.perf_ns / 1e9) - (prev.wall - prev.perf_ns / 1e9)
    assert step == pytest.approx(30.0, abs=0.05)  # the wall clock's drift since import
    p0 = time.perf_counter()
    before = clock.unix_now()
    old = clock.set_anchor(a)  # deliberate (tests, a worker taking the coordinator's)
    try:
        moved = clock.unix_now() - before - step
        p1 = time.perf_counter()
        assert -1e-6 <= moved <= p1 - p0 + 1e-6
        assert clock.unix_at_ns(a.perf_ns) == a.wall
    finally:
        clock.set_anchor(old)
    assert old == prev
    assert -1e-6 <= clock.unix_now() - before <= time.perf_counter() - p0 + 1e-6


def test_unix_at_ns_converts_the_proxys_perf_counter_stamps() -> None:
    t_ns = time.perf_counter_ns()
    now = clock.unix_now()
    t1_ns = time.perf_counter_ns()
    # now was read between the two stamps however long apart they are (abs=0.001 around
    # the first alone failed if the test was held a millisecond between the two lines)
    assert clock.unix_at_ns(t_ns) <= now <= clock.unix_at_ns(t1_ns)
    assert clock.unix_at_ns(t_ns + 1_500_000_000) - clock.unix_at_ns(t_ns) == pytest.approx(
        1.5, abs=1e-6
    )


def test_the_anchor_round_trips_and_bad_ones_are_refused() -> None:
    a = clock.anchor()
    assert clock.Anchor.decode(a.encode()) == a
    env = {clock.ENV: a.encode(), "OTHER": "x"}
    assert clock.initial_anchor(env) == a
    assert env == {"OTHER": "x"}  # taken out: not handed further down
    future = clock.Anchor(a.wall, time.perf_counter_ns() + 10**12)  # another boot's
    for text in (future.encode(), "nonsense", "1.5", "nan:5", "1e300:5", ":"):
        w0 = time.time()
        fresh = clock.initial_anchor({clock.ENV: text})
        assert fresh != a and w0 <= fresh.wall <= time.time(), text


def test_a_child_process_adopts_the_anchor_it_is_given() -> None:
    code = "from llmtop import clock; print(clock.anchor().encode())"
    env = {**os.environ, **clock.child_env()}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert clock.Anchor.decode(out) == clock.anchor()


async def test_workers_are_started_with_the_coordinators_anchor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, str] = {}

    class Started(Exception):
        pass

    async def fake_exec(*cmd: str, env: dict[str, str] | None = None, **kw: Any) -> None:
        seen.update(env or {})
        raise Started

    monkeypatch.setattr(asyncio, "create_subprocess_exec", fake_exec)
    cfg = load_config(env={}, overrides={"upstream": "http://127.0.0.1:9"})
    with pytest.raises(Started):
        await WorkerLauncher(cfg, "127.0.0.1:1", "http://127.0.0.1:2/x", "tok").start(0)
    assert seen.get(clock.ENV) == clock.anchor().encode()


@pytest.mark.parametrize(
    "stamper",
    [Aggregator.__init__, EngineScraper.__init__, GpuSampler.__init__, SimGpuSource.__init__],
    ids=["aggregator", "engine scraper", "gpu sampler", "sim gpu"],
)
def test_llmtops_stampers_default_to_its_clock(stamper: Callable[..., Any]) -> None:
    assert inspect.signature(stamper).parameters["clock"].default is clock.unix_now
