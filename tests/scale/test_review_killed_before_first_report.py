"""A worker process killed before the coordinator read any report of it: the requests it
opened are counted from the shared table's running total, as unreported ones; its first
POST, still in flight at the kill and read after its death was seen, must not publish
them a second time, nor leave its open requests on the screens. The coordinator knows a
process's sender (its id in every POST) from its start (``WorkerLauncher.senders``), not
only from its reports. Real ingest route and sockets, real (stand-in) worker processes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections import Counter

import aiohttp
from aiohttp import web
from test_lost_count_once import until
from test_scale_forwarder_codec import TOKEN, active, record

from llmtop.bus import EventBus
from llmtop.events import Event, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.worker_procs import Supervisor
from llmtop.workers import SENDER_ENV, EventForwarder, FleetActive, ingest_route
from llmtop.workers_wire import INGEST_PATH, TOKEN_HEADER, encode_batch


class Launcher:
    """Starts stand-in workers, each with its sender named at start, as WorkerLauncher."""

    def __init__(self) -> None:
        self.senders: dict[int, str] = {}
        self.started = 0

    async def start(self, index: int) -> asyncio.subprocess.Process:
        self.started += 1
        self.senders[index] = f"p{self.started}"
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def test_a_first_report_read_after_the_death_counts_nothing_twice() -> None:
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
    dead = launcher.senders[1]
    sup = Supervisor(launcher, procs, counts, fleet, [].append,  # type: ignore[arg-type]
                     publish=bus.publish, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    ended = [dataclasses.replace(record(i), id=f"w1-e{i}") for i in range(2)]
    still_open = active(3)
    try:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: TOKEN}) as http:
            # worker 1's first process opened 3 requests (2 ended, 1 open) and was killed
            # before the coordinator read its first POST
            counts._opened[1], counts._slots[1] = 3, 1  # (as the worker writes them)
            procs[1].kill()
            await until(lambda: sup.restarts == 1, "worker 1 restarted")
            body = encode_batch(1, 0, ended, [still_open], sender=dead, seq=1)
            async with http.post(url, data=body) as resp:  # its first POST, read late
                assert resp.status == 200
            # the dead process's open request is not shown as open on the screens
            assert still_open.id not in fleet, dict(fleet)
        bus.drain()
    finally:
        await sup.stop_all(task, 1.0)
        await runner.cleanup()
        counts.close()
    ids = Counter(e.id for e in got if isinstance(e, RequestRecord))
    # its 3 requests, each once: counted when its death was seen (1 open, 2 ended since),
    # and its late records not published again
    assert sum(ids.values()) == 3, ids
    assert all("-lost-" in i for i in ids), ids


def test_a_worker_forwards_under_the_sender_its_launcher_named() -> None:
    os.environ[SENDER_ENV] = "named-by-the-launcher"
    try:
        fwd = EventForwarder("http://127.0.0.1:9/x", TOKEN, 0, {})
    finally:
        del os.environ[SENDER_ENV]
    assert fwd.sender == "named-by-the-launcher"
    fwd.client.close()
    fwd = EventForwarder("http://127.0.0.1:9/x", TOKEN, 0, {})  # started by hand: its own
    assert len(fwd.sender) == 16 and fwd.sender != "named-by-the-launcher"
    fwd.client.close()
