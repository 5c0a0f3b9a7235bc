"""QA: ``llmtop run --workers 2`` left running for a week with one worker crashing every few
minutes. Each restart is a new worker process (a new sender id); the coordinator's
per-sender bookkeeping — the ingest route's last POST taken, :class:`LostEvents`' totals,
:class:`FleetActive`'s retired senders — kept one entry per process for good."""

from __future__ import annotations

import asyncio
import inspect
import sys

import aiohttp
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, active, record

from llmtop.bus import EventBus
from llmtop.events import Event, RequestRecord, WarningEvent
from llmtop.worker_procs import MAX_RESTARTS, Supervisor
from llmtop.workers import LOST_IDS_KEPT, SENDERS_KEPT, FleetActive, LostEvents, ingest_route
from llmtop.workers_wire import INGEST_PATH, TOKEN_HEADER, encode_batch

RESTARTS = 7 * 24 * 60 // 3  # worker 1 crashes every 3 minutes for 7 days


async def test_a_week_of_worker_restarts_keeps_per_sender_state_bounded() -> None:
    bus, fleet, got = EventBus(), FleetActive(), list[Event]()
    bus.subscribe(got.extend)
    lost = LostEvents(bus.publish)
    route = ingest_route(bus, fleet, TOKEN, lost)
    last_seq = inspect.getclosurevars(route.handler).nonlocals["last_seq"]
    app = web.Application()
    app.add_routes([route])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    headers = {TOKEN_HEADER: TOKEN}
    try:
        async with aiohttp.ClientSession() as http:
            async def post(worker: int, sender: str, seq: int, dropped: int,
                           events: list[Event]) -> None:
                body = encode_batch(worker, dropped, events, [active(worker)],
                                    sender=sender, seq=seq)
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200

            await post(0, "steady", 1, 0, [record(0)])  # worker 0 never restarts
            for k in range(RESTARTS):
                sender = f"w1-proc-{k}"
                await post(1, sender, 1, 1, [record(1)])  # each process gave up one event
                await post(1, sender, 1, 1, [record(1)])  # its reply lost: sent again
                await post(0, "steady", k + 2, 0, [])
                fleet.drop(1)  # it crashed: the supervisor drops it...
                await post(1, sender, 2, 1, [])  # ...and its last POST comes after
            await post(0, "steady", 1, 0, [record(0)])  # a week-old POST sent again
        bus.drain()
    finally:
        await runner.cleanup()
    assert len(last_seq) <= SENDERS_KEPT
    assert len(lost.by_sender) <= SENDERS_KEPT
    assert len(fleet._retired) <= SENDERS_KEPT
    assert len(fleet._lost_ids) <= LOST_IDS_KEPT
    # what the bookkeeping is for still holds: every POST taken once, every loss counted
    # once, a retired process's late report not taken as open requests
    assert sum(type(e) is RequestRecord for e in got) == RESTARTS + 1
    assert lost.total == RESTARTS and lost.by_worker == {1: RESTARTS}
    assert list(fleet.by_worker) == [0] and not fleet.serving(f"w1-proc-{RESTARTS - 1}")
    assert any(type(e) is WarningEvent and e.code == "EVENTS_LOST" for e in got)


async def test_a_week_of_restarts_keeps_the_supervisors_bookkeeping_bounded() -> None:
    """The supervisor's side of the same week: worker 1's exits (a real exited process)
    every 3 simulated minutes, each with open requests. Its exit times are kept for the
    restart window only, it is restarted each time (never given up: 3 minutes apart is
    not a crash loop), and the open requests it lost are published once each."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
    await proc.wait()
    now = [0.0]
    fleet, said = FleetActive(), list[Event]()
    sup = Supervisor(None, [proc, proc], None, fleet, lambda line: None,  # type: ignore[arg-type]
                     publish=said.append, clock=lambda: now[0])
    most = 0
    for k in range(RESTARTS):
        now[0] += 180.0
        fleet.update(1, [active(k)], sender=f"w1-proc-{k}")
        assert sup._exited(1) == sup.first_delay_s
        sup._up(1)
        most = max(most, sum(len(d) for d in sup.exits.values()))
    assert most <= MAX_RESTARTS
    assert not sup.given_up and not sup.down and not sup.silent
    assert sum(type(e) is RequestRecord for e in said) == RESTARTS
    assert len(fleet._retired) <= SENDERS_KEPT and not fleet.by_worker
