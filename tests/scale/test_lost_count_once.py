"""A killed worker's requests that no report carried (opened and ended after its last
report, their records dead in its buffer) are counted from the shared table's running
total of requests opened (:mod:`llmtop.fleet_counts`): each once, whatever comes after.
Its last POST can still be read after its death was seen — a record in it of a request
already counted lost is not published again; and a restarted worker's new process counts
its opened requests from 0 (its slot is reused), so its own death counts none of the old
process's again. Real ingest route and sockets, real (stand-in) worker processes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections import Counter

import aiohttp
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, active, record

from llmtop.bus import EventBus
from llmtop.events import ActiveRequest, Event, RequestRecord, WarningEvent
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor
from llmtop.workers import FleetActive, ingest_route
from llmtop.workers_wire import INGEST_PATH, TOKEN_HEADER, encode_batch


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def until(cond: object, what: str) -> None:
    for _ in range(500):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_each_request_is_counted_once_across_a_late_report_and_a_restart() -> None:
    bus, fleet, got = EventBus(), FleetActive(), list[Event]()
    bus.subscribe(got.extend)
    app = web.Application()
    app.add_routes([ingest_route(bus, fleet, TOKEN)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    said: list[str] = []
    sup = Supervisor(launcher, procs, counts, fleet, said.append,  # type: ignore[arg-type]
                     publish=bus.publish, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    a, b = active(1), active(2)  # open at worker 1's last report
    done_a = dataclasses.replace(record(0), id=a.id)  # a ended after that report
    since = dataclasses.replace(record(2), id="w1-new")  # opened and ended since
    first = dataclasses.replace(record(4), id="w1-first")  # reported as it ended
    try:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: TOKEN}) as http:
            async def post(sender: str, seq: int, events: list[Event],
                           open_now: list[ActiveRequest]) -> None:
                body = encode_batch(1, 0, events, open_now, sender=sender, seq=seq)
                async with http.post(url, data=body) as resp:
                    assert resp.status == 200

            # worker 1's process p1 opened 5: "first" (ended, reported), a and b (open at
            # its last report), "w1-new" and one more (opened and ended since): b is open
            # at the kill
            counts._opened[1], counts._slots[1] = 5, 1  # (as the worker writes them)
            await post("p1", 1, [first], [a, b])
            procs[1].kill()
            await until(lambda: sup.restarts == 1, "worker 1 restarted")
            await post("p1", 2, [done_a, since], [b])  # its last POST, read late
            assert counts.opened(1) == 0 and counts.count(1) == 0  # the new process's slot
            # the new process p2 opens and ends one request, reported; then it is killed
            counts._opened[1] = 1
            await post("p2", 1, [dataclasses.replace(record(6), id="w1-p2")], [])
            procs[1].kill()
            await until(lambda: sup.restarts == 2, "worker 1 restarted again")
        bus.drain()
    finally:
        await sup.stop_all(task, 1.0)
        await runner.cleanup()
        counts.close()
    ids = Counter(e.id for e in got if isinstance(e, RequestRecord))
    unreported = sorted(i for i in ids if "-lost-" in i)
    # p1's five, each once: "first" as it ended, a and b as lost, and two unreported
    # ("w1-new" among them: its late record is not published again); p2's one as it ended
    assert len(unreported) == 2, ids
    assert ids == {"w1-first": 1, a.id: 1, b.id: 1, unreported[0]: 1, unreported[1]: 1,
                   "w1-p2": 1}, ids
    lost = [e for e in got if isinstance(e, RequestRecord) and e.id in unreported]
    assert all(r.outcome == "error" and r.error is not None
               and "ended after its last report" in r.error for r in lost), lost
    warnings = [e for e in got if isinstance(e, WarningEvent) and e.code == "EVENTS_LOST"]
    assert len(warnings) == 1, warnings  # a (ended since the report) and the two unreported
    assert warnings[0].message.startswith("3 events"), warnings[0].message
    exits = [line for line in said if "exited" in line]
    assert len(exits) == 2, said
    assert exits[0].endswith(
        "its 1 open request was lost; 1 request its last report had open ended since, its "
        "record lost with it (counted as errors); 2 requests it opened and ended after its "
        "last report, their records lost with it (counted as errors; EVENTS_LOST)"), exits
    assert "after its last report" not in exits[1], exits  # p2 reported all it opened
