"""The coordinator's ingest route (on the observers' loop) takes a worker's POST while the
supervisor (on the main loop, another thread) may see that worker's process die: the POST's
records and its open requests must be taken as one step under FleetActive's lock, or a
death seen between the two counts a request twice — its record published from the POST,
and again as lost from the previous report's open requests, which still listed it.

The supervisor's side runs in a real thread at the exact point between publishing the
POST's first record and the end of the handler (a bus whose publish runs it and waits for
it): where it ran before the fix, between counting the records and taking the open ones.
Real ingest route and sockets."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import aiohttp
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, active, record

from llmtop.bus import EventBus
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.workers import FleetActive, ingest_route
from llmtop.workers_wire import INGEST_PATH, TOKEN_HEADER, encode_batch


class DeathMidPost(EventBus):
    """Runs ``retire`` in another thread, once, as the first record is published."""

    def __init__(self, fleet: FleetActive, opened: int) -> None:
        super().__init__()
        self.fleet, self.opened = fleet, opened
        self.armed = False
        self.retired: tuple[list[ActiveRequest], int] | None = None

    def publish(self, event: Event) -> None:
        if self.armed and type(event) is RequestRecord:
            self.armed = False

            def supervisor() -> None:  # Supervisor._count_lost's call
                self.retired = self.fleet.retire(1, self.opened)

            t = threading.Thread(target=supervisor)
            t.start()
            t.join()
        super().publish(event)


async def test_a_death_seen_while_a_post_is_taken_counts_each_request_once() -> None:
    fleet = FleetActive()
    bus = DeathMidPost(fleet, opened=2)  # worker 1's process opened 2: a, then b
    got: list[Event] = []
    bus.subscribe(got.extend)
    app = web.Application()
    app.add_routes([ingest_route(bus, fleet, TOKEN)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{INGEST_PATH}"
    a, b = active(1), active(2)
    done_a = dataclasses.replace(record(0), id=a.id)
    try:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: TOKEN}) as http:
            for seq, events, open_now in ((1, [], [a]), (2, [done_a], [b])):
                bus.armed = seq == 2  # the process dies as its second POST is taken
                body = encode_batch(1, 0, events, open_now, sender="p1", seq=seq)
                async with http.post(url, data=body) as resp:
                    assert resp.status == 200
        bus.drain()
    finally:
        await runner.cleanup()
    assert bus.retired is not None
    lost, unreported = bus.retired
    ids = Counter(e.id for e in got if isinstance(e, RequestRecord))
    ids.update(x.id for x in lost)  # the supervisor publishes these as failed
    # a: its record, once; b: open at the death, as the POST said (lost), once
    assert ids == {a.id: 1, b.id: 1}, (ids, unreported)
    assert unreported == 0
    assert b.id not in fleet and a.id not in fleet  # the dead process shows nothing open
