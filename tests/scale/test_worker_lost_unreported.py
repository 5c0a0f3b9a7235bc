"""A worker killed with requests open that its last report (every 0.5 s) did not carry yet:
the shared table of open requests (:mod:`llmtop.fleet_counts`) still has their number, and
each of them is counted as a failed request, as the reported ones are. Before, only the
requests of the last report were counted: a worker killed within half a second of a burst
lost those requests from every count (snapshot, /metrics, recording) without a trace —
20 of 40 clients saw their streams cut and the proxy said it served 20 requests, 0 errors."""

from __future__ import annotations

import asyncio
import os
import sys

from llmtop.events import ActiveRequest, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor
from llmtop.workers import FleetActive


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


def held(n: int) -> list[ActiveRequest]:
    return [ActiveRequest(f"w1-{i}", "u", "m", "openai", "/v1", True, 0.0, 0)
            for i in range(n)]


async def lost_on_kill(slot: int, reported: int) -> list[RequestRecord]:
    """Worker 1's slot says ``slot`` open requests, its last report listed ``reported``;
    it is killed: the records the coordinator publishes for it."""
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    active = FleetActive()
    active.update(1, held(reported), "s1")
    counts._slots[1] = slot
    published: list[object] = []
    sup = Supervisor(launcher, procs, counts, active, lambda line: None,  # type: ignore[arg-type]
                     publish=published.append, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    try:
        procs[1].kill()
        for _ in range(500):
            if sup.restarts:
                break
            await asyncio.sleep(0.01)
        assert sup.restarts == 1
    finally:
        await sup.stop_all(task, 1.0)
        counts.close()
    return [r for r in published if isinstance(r, RequestRecord)]


async def test_requests_opened_after_the_last_report_are_counted_lost() -> None:
    lost = await lost_on_kill(slot=5, reported=2)
    assert len(lost) == 5, lost  # the 2 reported and the 3 it had opened since
    assert sorted(r.id for r in lost)[:2] == ["w1-0", "w1-1"]
    assert len({r.id for r in lost}) == 5  # each its own id
    unseen = [r for r in lost if not r.id.startswith("w1-")]
    assert all(r.outcome == "error" and r.status == 502 and r.ttft_s is None
               and not r.upstream_unreachable for r in unseen)
    assert all(r.error is not None and "worker 1 exited (killed by SIGKILL)" in r.error
               and "after its last report" in r.error for r in unseen)


async def test_a_worker_killed_before_its_first_report_counts_its_requests() -> None:
    lost = await lost_on_kill(slot=4, reported=0)
    assert len(lost) == 4


async def test_reported_requests_are_not_counted_twice() -> None:
    """Fewer open at the kill than last reported (some finished since; their records died
    in the worker's buffer): the reported ones, each once."""
    lost = await lost_on_kill(slot=1, reported=3)
    assert sorted(r.id for r in lost) == ["w1-0", "w1-1", "w1-2"]
