"""A worker that gave up records (its buffer full) and is later killed: the records it gave
up are counted once in EVENTS_LOST (as given up: missing from the counts, as when it lives
on), not a second time as requests its death left unreported. The worker side (its shared
table slot, attached as a worker process attaches it, and its event forwarder) and the
coordinator side (the real ingest route over a socket, the supervisor with a stand-in
worker process) in one test process."""

from __future__ import annotations

import asyncio
import os
import sys

from aiohttp import web
from test_lost_count_once import until
from test_scale_forwarder_codec import TOKEN, record

from llmtop.bus import EventBus
from llmtop.events import Event, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor
from llmtop.workers import EventForwarder, FleetActive, LostEvents, ingest_route
from llmtop.workers_wire import INGEST_PATH


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def test_records_given_up_then_a_death_are_lost_once_not_counted_twice() -> None:
    bus, fleet, got = EventBus(), FleetActive(), list[Event]()
    bus.subscribe(got.extend)
    lost = LostEvents(bus.publish)
    app = web.Application()
    app.add_routes([ingest_route(bus, fleet, TOKEN, lost)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    counts, path = FleetCounts.create(2)
    mine = FleetCounts.attach(path, 1)  # worker 1's own mapping
    os.unlink(path)
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    sup = Supervisor(launcher, procs, counts, fleet, [].append,  # type: ignore[arg-type]
                     publish=bus.publish, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    fwd = EventForwarder(url, TOKEN, 1, {}, max_buffer=3, table=mine)  # as serve_worker makes it
    try:
        for n in range(1, 6):  # it opens 5 requests (the proxy's call), one at a time
            mine.opened_one(n)
        mine.set_mine(0)  # all 5 ended
        fwd.on_events([record(i) for i in range(5)])  # a full buffer: 2 given up
        assert fwd.dropped == 2
        assert await fwd.post()  # the 3 kept reach the coordinator, and dropped = 2
        procs[1].kill()
        await until(lambda: sup.restarts == 1, "worker 1 restarted")
        bus.drain()
    finally:
        fwd.client.close()
        await sup.stop_all(task, 1.0)
        await runner.cleanup()
        mine.close()
        counts.close()
    ids = [e.id for e in got if isinstance(e, RequestRecord)]
    assert sorted(ids) == [record(i).id for i in range(3)], ids  # none "-lost-"
    assert lost.total == 2 and lost.unreported == 0, (lost.total, lost.unreported)
