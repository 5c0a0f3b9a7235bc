"""A worker that stops reporting when no other worker reports beside it (``--split-observers``:
one worker; or the others exited) is named and raises WORKER_DOWN as one of several is.
Before, a silent worker was named only while another still reported: QA, --split-observers
and SIGSTOP to its one worker — no warning, for good, every client connection waiting."""

from __future__ import annotations

import asyncio
import sys
import time

from llmtop.events import WarningEvent
from llmtop.worker_procs import SILENT_S, Supervisor
from llmtop.workers import FleetActive


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def test_the_only_worker_silent_is_named_and_then_cleared() -> None:
    proc = await Launcher().start(0)
    active = FleetActive()
    active.update(0, [], "s0")
    said: list[str] = []
    warned: list[WarningEvent] = []
    sup = Supervisor(Launcher(), [proc], None, active, said.append,  # type: ignore[arg-type]
                     publish=warned.append)  # type: ignore[arg-type]
    try:
        now = time.monotonic()
        sup.check_reports(now + 1)
        assert not sup.down  # reported a second ago
        sup.check_reports(now + SILENT_S + 1)
        assert 0 in sup.down and sup.silent == {0}, said
        assert "has not reported for 11 s although it runs" in said[-1]
        assert [w.state for w in warned] == ["raised"]
        active.update(0, [], "s0")  # it reports again
        sup.check_reports(time.monotonic())
        assert not sup.down and not sup.silent
        assert said[-1] == "llmtop: worker 0 reports again"
        assert [w.state for w in warned] == ["raised", "cleared"]
    finally:
        proc.kill()
        await proc.wait()
