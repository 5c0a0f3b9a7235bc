"""The coordinator's watch over its workers (``llmtop.worker_procs.Supervisor``), with real
child processes that exit at once, a real shared table and the real open-request list."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

import pytest

from llmtop.events import ActiveRequest, RequestRecord, WarningEvent
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import MAX_RESTARTS, Supervisor, describe_exit
from llmtop.workers import FleetActive


class ExitingLauncher:
    """Starts processes that exit with ``code`` at once (or sleep, with ``code`` None);
    ``then``: the code for the starts after the first ``times``."""

    def __init__(self, code: int | None, *, times: int | None = None,
                 then: int | None = None) -> None:
        self.code = code
        self.times = times
        self.then = then
        self.started: list[int] = []

    async def start(self, index: int) -> asyncio.subprocess.Process:
        self.started.append(index)
        code = self.code if self.times is None or len(self.started) <= self.times \
            else self.then
        prog = "import time; time.sleep(60)" if code is None else f"raise SystemExit({code})"
        return await asyncio.create_subprocess_exec(sys.executable, "-c", prog)


async def until(cond: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Poll ``cond`` every 10 ms until it holds or ``timeout_s`` passes (the asserts after
    say what failed)."""
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)


def held(n: int) -> list[ActiveRequest]:
    return [ActiveRequest(f"w-{i}", "u", "m", "openai", "/v1", True, 0.0, 0)
            for i in range(n)]


async def test_a_worker_that_keeps_dying_is_restarted_then_left_stopped() -> None:
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    counts._slots[1] = 7  # worker 1's last count before it died
    active = FleetActive()
    active.update(1, held(3))
    active.update(0, held(2))
    said: list[str] = []
    warned: list[WarningEvent] = []
    dying = ExitingLauncher(3)
    first = await dying.start(1)
    dying.started.clear()
    sleeper = await ExitingLauncher(None).start(0)
    sup = Supervisor(dying, [sleeper, first], counts, active, said.append,  # type: ignore[arg-type]
                     publish=warned.append, first_delay_s=0.001)  # type: ignore[arg-type]
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.given_up)
        assert sup.given_up == {1}
        assert dying.started == [1] * MAX_RESTARTS and sup.restarts == MAX_RESTARTS
        assert counts.count(1) == 0 and len(active) == 2  # worker 0's requests remain
        assert said[0].startswith("llmtop: worker 1 exited (exit code 3)")
        assert "restarting it in 0.001 s" in said[0]
        assert "restarting it in 0.002 s" in said[2]  # doubling while it keeps failing
        # the count of what it lost, and none said where it had nothing open (a worker
        # stopped cleanly read "its open requests are lost" too)
        assert said[0].endswith("in 0.001 s; its 7 open requests were lost"), said[0]
        assert said[2].endswith("restarting it in 0.002 s"), said[2]
        assert "not restarted; the other workers go on" in said[-1]
        assert sup.procs[0] is sleeper and sleeper.returncode is None
        warnings = [w for w in warned if isinstance(w, WarningEvent)]
        assert {w.code for w in warnings} == {"WORKER_DOWN"}
        assert warnings[-1].state == "raised" and warnings[-1].severity == "critical"
        assert warnings[-1].message.startswith("1 of 2 workers serving: worker 1 exited "
                                               "(exit code 3) 6 times in 60 s: not restarted")
        # the 3 requests it had open failed for their clients: counted as errors, once;
        # and the 4 more its slot counted, opened after its last report
        lost = [r for r in warned if isinstance(r, RequestRecord)]
        assert sorted(r.id for r in lost)[:3] == ["w-0", "w-1", "w-2"]
        assert len({r.id for r in lost}) == len(lost) == 7
        assert all(r.outcome == "error" and r.status == 502 and r.error is not None
                   and r.error.startswith("llmtop worker 1 exited (exit code 3)")
                   for r in lost)
    finally:
        await sup.stop_all(task, 1.0)
        counts.close()
    assert sleeper.returncode is not None  # stopped with the rest
    assert not any("worker 0" in line for line in said)  # a stop is not a death


async def test_a_worker_that_exits_once_raises_then_clears_worker_down() -> None:
    launcher = ExitingLauncher(None)
    once = ExitingLauncher(5, times=1, then=None)  # exits, then its restart stays up
    procs = [await launcher.start(0), await once.start(1)]
    warned: list[WarningEvent] = []
    sup = Supervisor(once, procs, None, FleetActive(), lambda line: None,  # type: ignore[arg-type]
                     publish=warned.append, first_delay_s=0.001)  # type: ignore[arg-type]
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.restarts)
        assert sup.restarts == 1 and not sup.down and not sup.given_up
        assert [w.state for w in warned] == ["raised", "cleared"]
        assert warned[0].message.startswith("1 of 2 workers serving: worker 1 exited "
                                            "(exit code 5); restarting it")
        assert warned[1].message == "all 2 workers serving again"
    finally:
        await sup.stop_all(task, 1.0)


class SlowLauncher(ExitingLauncher):
    """Worker 0 takes ``slow_s`` to start (a loaded machine); the others start at once."""

    def __init__(self, slow_s: float) -> None:
        super().__init__(None)
        self.slow_s = slow_s

    async def start(self, index: int) -> asyncio.subprocess.Process:
        if index == 0:
            await asyncio.sleep(self.slow_s)
        return await super().start(index)


async def test_one_slow_restart_delays_no_other_workers_cleanup() -> None:
    """Worker 0 dies and its restart hangs; worker 1 dies a moment later: worker 1's slot
    and open requests are cleared at once, not after worker 0's restart."""
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    active = FleetActive()
    launcher = SlowLauncher(slow_s=60.0)
    procs = [await ExitingLauncher(0).start(0), await ExitingLauncher(None).start(1)]
    said: list[str] = []
    sup = Supervisor(launcher, procs, counts, active, said.append,  # type: ignore[arg-type]
                     first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: 0 in sup.down)  # worker 0 gone, its restart under way
        counts._slots[1] = 9
        active.update(1, held(4))
        procs[1].kill()
        # (within 20 s, a third of worker 0's minute: a loaded machine starts a process slowly)
        await until(lambda: any("worker 1 restarted" in line for line in said), 20.0)
        # worker 1 was cleaned up and started again while worker 0 is still starting
        assert any("worker 1 exited (killed by SIGKILL)" in line for line in said), said
        assert any("worker 1 restarted" in line for line in said), said
        assert counts.count(1) == 0 and len(active) == 0
        assert list(sup.down) == [0] and sup.restarts == 1
    finally:
        await sup.stop_all(task, 1.0)
        counts.close()


async def test_no_restart_once_stopping() -> None:
    """A worker that exits because the proxy is stopping is not started again."""
    launcher = ExitingLauncher(None)
    procs = [await launcher.start(0)]
    said: list[str] = []
    sup = Supervisor(launcher, procs, None, FleetActive(), said.append)  # type: ignore[arg-type]
    task = asyncio.create_task(sup.run())
    await asyncio.sleep(0.05)
    await sup.stop_all(task, 1.0)
    assert procs[0].returncode is not None
    assert launcher.started == [0] and said == [] and sup.restarts == 0


def test_exits_are_described_for_people() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert describe_exit(None) == "still running"


def test_a_dead_workers_late_report_does_not_bring_its_requests_back() -> None:
    """The ingest route runs on the observers' loop and the supervisor on the main one: a
    dead worker's last report can be filed after its death was seen. Its process (sender)
    is not heard again; the restarted worker, a new sender at the same index, is."""
    active = FleetActive()
    active.update(1, held(3), "old")
    active.update(0, held(2), "w0")
    active.drop(1)
    active.update(1, held(3), "old")  # late
    assert len(active) == 2 and set(active.by_worker) == {0}
    active.update(1, held(1), "new")  # the restarted worker
    assert len(active) == 3


async def test_a_worker_not_ready_in_time_is_named_with_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that does not say it listens within the wait: a sentence naming it and the
    wait (was a bare TimeoutError, shown as "llmtop run: error: " and nothing else)."""
    from llmtop import worker_procs
    from llmtop.config import load_config
    from llmtop.worker_procs import StartupErrorProxy, WorkerLauncher

    monkeypatch.setattr(worker_procs, "READY_TIMEOUT_S", 0.01)  # no interpreter starts so fast
    cfg = load_config(env={}, overrides={"upstream": "http://127.0.0.1:9"})
    launcher = WorkerLauncher(cfg, "127.0.0.1:0", "http://127.0.0.1:9/ingest", "tok")
    with pytest.raises(StartupErrorProxy,
                       match=r"worker 3 did not start: not listening after 0\.01 s"):
        await launcher.start(3)
