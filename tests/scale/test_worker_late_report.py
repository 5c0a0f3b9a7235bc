"""A worker killed with a POST on its way: the coordinator can read that last report after
the supervisor has seen the death and counted the requests of the report before as lost. A
request among those that finished in between came twice — once lost (an error), once as
its own record — and the counts read one request, one error too many. Each request counts
once: the late report's records of requests already counted lost are left out, the others
(opened and finished since the report before) are taken."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections import Counter

import aiohttp
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, active, record

from llmtop.bus import EventBus
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.worker_procs import Supervisor
from llmtop.workers import FleetActive, ingest_route
from llmtop.workers_wire import INGEST_PATH, TOKEN_HEADER, encode_batch


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def test_a_late_report_counts_no_request_twice() -> None:
    bus, fleet, got = EventBus(), FleetActive(), list[Event]()
    bus.subscribe(got.extend)
    app = web.Application()
    app.add_routes([ingest_route(bus, fleet, TOKEN)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    sup = Supervisor(launcher, procs, None, fleet, lambda line: None,  # type: ignore[arg-type]
                     publish=bus.publish, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    a, b = active(1), active(2)  # open at worker 1's report before its death
    done_a = dataclasses.replace(record(0), id=a.id)  # a finished after that report
    since = dataclasses.replace(record(2), id="w1-new")  # opened and finished since
    try:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: TOKEN}) as http:
            async def post(seq: int, events: list[Event], open_now: list[ActiveRequest]) -> None:
                body = encode_batch(1, 0, events, open_now, sender="p1", seq=seq)
                async with http.post(url, data=body) as resp:
                    assert resp.status == 200

            await post(1, [], [a, b])
            procs[1].kill()
            for _ in range(500):  # the supervisor sees the death first...
                if sup.restarts:
                    break
                await asyncio.sleep(0.01)
            assert sup.restarts == 1
            await post(2, [done_a, since], [b])  # ...then its last report comes
        bus.drain()
    finally:
        await sup.stop_all(task, 1.0)
        await runner.cleanup()
    ids = Counter(e.id for e in got if isinstance(e, RequestRecord))
    assert ids == {a.id: 1, b.id: 1, "w1-new": 1}, ids
