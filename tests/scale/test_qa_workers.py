"""QA of ``llmtop run --workers N``: what the coordinator does about workers that lose events
or stop reporting."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, record
from test_workers import start_run, worker_pids

from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import Event, WarningEvent, WarningState
from llmtop.metrics.aggregator import Aggregator
from llmtop.out_of_files_warning import CODE as OUT_OF_FILES
from llmtop.out_of_files_warning import OutOfFilesSources
from llmtop.sim.server import running_sim
from llmtop.workers import (
    LOST_REPORT_S,
    EventForwarder,
    FleetActive,
    LostEvents,
    ingest_route,
)
from llmtop.workers_wire import INGEST_PATH


@pytest.fixture
async def ingest() -> AsyncIterator[tuple[str, EventBus, list[Event]]]:
    """A coordinator's ingest route on a real socket: its URL, bus and what it published."""
    bus, got = EventBus(), []
    bus.subscribe(got.extend)
    app = web.Application()
    app.add_routes([ingest_route(bus, FleetActive(), TOKEN)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}", bus, got
    finally:
        await runner.cleanup()


async def test_events_a_worker_gave_up_are_reported(
        ingest: tuple[str, EventBus, list[Event]]) -> None:
    """QA: a worker whose buffer overflowed (the coordinator too busy or unreachable for a
    while) or whose POST was refused counts the events it gave up and sends that count
    with every POST, and the coordinator read it and did nothing with it: the requests
    were missing from every figure, /metrics and the recording without a word. Now the
    coordinator raises EVENTS_LOST (critical) naming how many and whose."""
    url, bus, got = ingest
    fwd = EventForwarder(url, TOKEN, 1, {}, max_buffer=5)
    fwd.on_events([record(i) for i in range(8)])  # 3 past the buffer
    assert fwd.dropped == 3
    assert await fwd.post()
    fwd.client.close()
    bus.drain()
    records = [e for e in got if not isinstance(e, WarningEvent)]
    assert records == [record(i) for i in range(5)]
    (lost,) = [e for e in got if isinstance(e, WarningEvent)]
    assert (lost.code, lost.severity, lost.state) == ("EVENTS_LOST", "critical", "raised")
    assert lost.message.startswith("3 events (finished requests, stream progress) never "
                                   "reached the coordinator (worker 1: 3)")
    agg = Aggregator(Config())  # the live views and /metrics show it
    agg.on_events(got)
    assert [w["code"] for w in agg.snapshot(60)["warnings"]] == ["EVENTS_LOST"]
    fwd2 = EventForwarder(url, TOKEN, 1, {})  # a POST that loses nothing adds nothing
    fwd2.on_events([record(9)])
    assert await fwd2.post()
    fwd2.client.close()
    bus.drain()
    assert sum(isinstance(e, WarningEvent) for e in got) == 1
    refused = EventForwarder(url, "not-the-token", 2, {})  # refused: counted, sent later
    refused.on_events([record(10)])
    assert not await refused.post() and refused.dropped == 1
    refused.client.close()


async def test_one_workers_out_of_files_cleared_leaves_the_others_raised() -> None:
    """Each worker raises and clears OUT_OF_FILES on its own bus, shipped with its events.
    The aggregator keeps one warning per code: passed on as they came, worker 1's clear
    removed it while worker 0 was still turning clients away. Through the ingest route
    the coordinator keeps it raised while any worker is short, and a worker that exited
    short holds it up no longer."""
    bus, fleet = EventBus(), FleetActive()
    agg = Aggregator(Config())
    bus.subscribe(agg.on_events)
    app = web.Application()
    sources = OutOfFilesSources(bus.publish, live=fleet.serving)
    app.add_routes([ingest_route(bus, fleet, TOKEN, out_of_files=sources)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    workers = [EventForwarder(url, TOKEN, i, {}) for i in range(2)]

    async def ship(i: int, state: WarningState) -> list[dict[str, object]]:
        msg = (f"worker {i}: out of file descriptors (ulimit -n 64): new client "
               "connections are closed unanswered" if state == "raised"
               else f"worker {i}: file descriptors free again")
        workers[i].on_events([WarningEvent(1_800_000_000.0 + i, OUT_OF_FILES, "critical",
                                           msg, state)])
        assert await workers[i].post()
        bus.drain()
        return [w for w in agg.snapshot(60)["warnings"] if w["code"] == OUT_OF_FILES]

    try:
        assert [w["message"][:8] for w in await ship(0, "raised")] == ["worker 0"]
        (both,) = await ship(1, "raised")
        assert str(both["message"]).startswith("worker 0, worker 1: out of file descr")
        (left,) = await ship(1, "cleared")
        assert str(left["message"]).startswith("worker 0: out of file descriptors"), left
        assert left["since"] == 1_800_000_000.0  # raised since worker 0's first raise
        sources.prune()
        bus.drain()
        assert [w["code"] for w in agg.snapshot(60)["warnings"]] == [OUT_OF_FILES]
        fleet.drop(0)  # worker 0 exited, still short: the supervisor drops it
        sources.prune()
        bus.drain()
        assert agg.snapshot(60)["warnings"] == []
    finally:
        for w in workers:
            w.client.close()
        await runner.cleanup()


def test_lost_counts_add_up_per_worker_and_are_raised_at_most_every_10_s() -> None:
    now = [100.0]
    said: list[Event] = []
    lost = LostEvents(said.append, clock=lambda: now[0])
    lost.saw(0, "a", 0)
    assert said == []
    lost.saw(0, "a", 4)
    lost.saw(0, "a", 4)  # the same running total again: nothing new
    assert len(said) == 1
    lost.saw(1, "b", 2)  # grown within 10 s: said later, not now
    lost.saw(0, "c", 1)  # worker 0 restarted: a new process counts from 0
    assert len(said) == 1
    now[0] += LOST_REPORT_S
    lost.saw(1, "b", 2)
    assert len(said) == 2
    last = said[-1]
    assert isinstance(last, WarningEvent)
    assert last.message.startswith("7 events") and "(worker 0: 5, worker 1: 2)" in last.message


async def test_a_stuck_worker_is_reported_and_cleared_when_it_reports_again() -> None:
    """QA: SIGSTOP one of two workers (a worker whose loop is stuck behaves the same): its
    process still runs, so nothing noticed; the kernel kept handing it a share of new
    connections, which waited, its open requests stayed on the screens and no warning
    was raised. Now, once it has not reported for 10 s while the other does, the
    coordinator says so and raises WORKER_DOWN; when it reports again, the warning
    clears."""
    async with running_sim("tiny", max_num_seqs=16) as sim:
        proc, _, admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--gpu-source", "none")
        assert proc.stdout is not None
        stopped = 0
        try:
            async with aiohttp.ClientSession() as s:

                async def down(expected: bool) -> bool:
                    """Whether the snapshot shows WORKER_DOWN, once it is ``expected`` or
                    after 10 s (the aggregator takes a warning at its next tick)."""
                    for _ in range(40):
                        async with s.get(admin + "/llmtop/v1/snapshot") as r:
                            codes = [w["code"] for w in (await r.json())["warnings"]]
                        if ("WORKER_DOWN" in codes) == expected:
                            break
                        await asyncio.sleep(0.25)
                    return "WORKER_DOWN" in codes

                async def said(what: str) -> str:
                    while True:
                        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
                        assert line, "the coordinator exited"
                        if what in line:
                            return line

                await asyncio.sleep(1.5)  # both have reported
                stopped = worker_pids(proc.pid)[0]
                os.kill(stopped, signal.SIGSTOP)
                line = await said("has not reported")
                assert f"(pid {stopped}) has not reported for 1" in line, line
                assert await down(True)
                os.kill(stopped, signal.SIGCONT)
                stopped = 0
                await said("reports again")
                assert not await down(False)
        finally:
            if stopped:
                os.kill(stopped, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
