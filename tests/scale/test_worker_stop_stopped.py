"""Stopping ``--workers N`` while a worker is stopped (SIGSTOP, a debugger) or stuck.

A stopped worker holds the SIGTERM the coordinator sends it: before, the coordinator waited
the grace period and 10 s more, then killed it — QA: grace 2 s, a shutdown of 12 s — and the
requests it had open were counted nowhere (20 streams cut, "served 9 requests"). Now the
SIGTERM comes with a SIGCONT (its graceful stop runs within the grace), and a worker killed
at the deadline has its open requests counted as failed, as a worker that dies does."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from llmtop import worker_procs
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor, stop_workers
from llmtop.workers import FleetActive


async def child(prog: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import signal, sys, time\n{prog}\nprint('up', flush=True)\n"
        "time.sleep(60)", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"up\n"
    return proc


async def test_a_stopped_worker_stops_within_the_grace() -> None:
    proc = await child("")
    os.kill(proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        await stop_workers([proc], 0.5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == -signal.SIGTERM  # its SIGTERM ran (not the SIGKILL after)
    assert time.monotonic() - t0 < 5


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        raise AssertionError("no restart while stopping")


async def test_a_worker_killed_at_the_deadline_counts_its_open_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_procs, "FINAL_REPORT_S", 0.2)
    stuck = await child("signal.signal(signal.SIGTERM, signal.SIG_IGN)")  # never stops
    fine = await child("")
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    active = FleetActive()
    active.update(0, [ActiveRequest(f"w0-{k}", "u", "m", "openai", "/v1", True, 0.0, 0)
                      for k in range(2)], "s0")
    counts._slots[0] = 3  # one more opened since its last report
    published: list[object] = []
    sup = Supervisor(Launcher(), [stuck, fine], counts, active,  # type: ignore[arg-type]
                     lambda line: None, publish=published.append)
    task = asyncio.create_task(sup.run())
    await asyncio.sleep(0.05)
    try:
        await sup.stop_all(task, 0.1)
    finally:
        counts.close()
    assert stuck.returncode == -signal.SIGKILL
    assert fine.returncode != -signal.SIGKILL  # (-SIGTERM; 255 where another test's
    # child watcher reaped it first)
    lost = [r for r in published if isinstance(r, RequestRecord)]
    assert len(lost) == 3, published
    assert all(r.outcome == "error" and r.error is not None
               and "worker 0 exited (killed by SIGKILL)" in r.error for r in lost)
