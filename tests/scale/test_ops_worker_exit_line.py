"""A worker killed just after requests its last report had open ended (their records still
in its buffer): the shared table of open requests (:mod:`llmtop.fleet_counts`) says exactly
how many were open at the kill. The exit line said all the reported ones were open and
lost. End to end (``llmtop run --workers 2``, six short streams on one connection, the
workers SIGKILLed as the last answer arrived): every client got its whole answer, and the
line read 'its 1 open request was lost'. Those requests are still counted as failed (their
records are gone; the totals keep them); the line now says which is which."""

from __future__ import annotations

import asyncio
import os
import sys

from llmtop.events import ActiveRequest
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor
from llmtop.workers import FleetActive


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def exit_line(slot: int, reported: int) -> str:
    """Worker 1's slot says ``slot`` open requests, its last report listed ``reported``;
    the process is SIGKILLed: the coordinator's line about it."""
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    active = FleetActive()
    active.update(1, [ActiveRequest(f"w1-{i}", "u", "m", "openai", "/v1", True, 0.0, 0)
                      for i in range(reported)], "s1")
    counts._slots[1] = slot
    said: list[str] = []
    sup = Supervisor(launcher, procs, counts, active, said.append,  # type: ignore[arg-type]
                     publish=lambda e: None, first_delay_s=0.001)
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
    return next(line for line in said if "exited" in line)


async def test_requests_that_ended_are_not_called_open() -> None:
    line = await exit_line(slot=1, reported=3)
    assert line.endswith(
        "restarting it in 0.001 s; its 1 open request was lost; 2 requests its last "
        "report had open ended since, their records lost with it (counted as errors)"), line


async def test_none_open_at_the_kill() -> None:
    line = await exit_line(slot=0, reported=1)
    assert line.endswith(
        "restarting it in 0.001 s; 1 request its last report had open ended since, its "
        "record lost with it (counted as errors)"), line


async def test_more_open_than_reported_reads_as_before() -> None:
    line = await exit_line(slot=5, reported=2)
    assert line.endswith("restarting it in 0.001 s; its 5 open requests were lost"), line
