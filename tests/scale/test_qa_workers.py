"""QA of ``llmtop run --workers N``: what the coordinator does with what its workers lose."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from test_scale_forwarder_codec import TOKEN, record

from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import Event, WarningEvent
from llmtop.metrics.aggregator import Aggregator
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
