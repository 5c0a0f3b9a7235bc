"""A worker whose restart fails (its port briefly taken, a start-up slower than the wait on
a loaded machine) is tried again with the same backoff as a worker that keeps exiting, and
left stopped only after as many tries. Before, one failed start left it stopped for good:
QA, --split-observers, the worker killed and its port taken for a moment — the coordinator
served nothing for the rest of the run (0 of 1 workers serving), though the port was free
again a second later."""

from __future__ import annotations

import asyncio
import sys

from llmtop.worker_procs import MAX_RESTARTS, StartupErrorProxy, Supervisor
from llmtop.workers import FleetActive


class FailingLauncher:
    """Fails the first ``fails`` starts (None: every one), then starts a sleeper."""

    def __init__(self, fails: int | None) -> None:
        self.fails = fails
        self.tries = 0

    async def start(self, index: int) -> asyncio.subprocess.Process:
        self.tries += 1
        if self.fails is None or self.tries <= self.fails:
            raise StartupErrorProxy(f"worker {index} did not start: listen address "
                                    "127.0.0.1:1: Address already in use")
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def supervise(launcher: FailingLauncher, done: str) -> tuple[Supervisor, list[str]]:
    dying = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(1)")
    said: list[str] = []
    sup = Supervisor(launcher, [dying], None, FleetActive(), said.append,  # type: ignore[arg-type]
                     first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    try:
        for _ in range(1000):
            if getattr(sup, done):
                break
            await asyncio.sleep(0.01)
    finally:
        await sup.stop_all(task, 1.0)
    return sup, said


async def test_a_failed_restart_is_tried_again() -> None:
    launcher = FailingLauncher(fails=2)
    sup, said = await supervise(launcher, "restarts")
    assert sup.restarts == 1 and not sup.given_up, said
    assert launcher.tries == 3
    assert not sup.down
    assert any("could not be restarted" in line and "trying again in" in line
               for line in said), said
    assert said[-1] == "llmtop: worker 0 restarted"


async def test_a_worker_that_never_starts_is_given_up_after_the_tries() -> None:
    launcher = FailingLauncher(fails=None)
    sup, said = await supervise(launcher, "given_up")
    assert sup.given_up == {0} and sup.restarts == 0
    assert launcher.tries == MAX_RESTARTS  # the exit and the failed starts: one budget
    assert "not restarted" in said[-1] and "Address already in use" in said[-1], said
