"""The bus pump under a burst: when a thousand streams end in the same engine step, their
records must not be handed to the observers (aggregator, recorder, detectors) in one
go — that work runs on the proxy's event loop, and one 1,024-record batch holds it for
40–200 ms on this machine, delaying every stream's chunks and the admin API. The pump
delivers in slices and lets the loop run between them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from llmtop.bus import EventBus
from llmtop.events import Event, WarningEvent


async def test_pump_delivers_a_burst_in_slices_with_the_loop_running_between() -> None:
    bus = EventBus()
    timeline: list[object] = []

    def observer(batch: Sequence[Event]) -> None:
        timeline.append(len(batch))

    bus.subscribe(observer)
    for i in range(5000):
        bus.publish(WarningEvent(t=float(i), code="X", severity="info", message="m",
                                 state="raised"))

    async def other_work() -> None:  # stands for the forwarding path
        while True:
            timeline.append("tick")
            await asyncio.sleep(0)

    done = asyncio.Event()
    bus.subscribe(lambda _batch: done.set() if bus.pending() == 0 else None)
    pump = asyncio.create_task(bus.pump(0.001))
    ticker = asyncio.create_task(other_work())
    try:
        async with asyncio.timeout(5):
            await done.wait()
    finally:
        pump.cancel()
        ticker.cancel()
        await asyncio.gather(pump, ticker, return_exceptions=True)
    batches = [x for x in timeline if isinstance(x, int)]
    assert sum(batches) == 5000
    assert max(batches) <= 512, batches
    # between any two slices the loop ran other work
    positions = [i for i, x in enumerate(timeline) if isinstance(x, int)]
    for a, b in itertools.pairwise(positions):
        assert "tick" in timeline[a + 1:b], (a, b)


def test_drain_still_delivers_everything_at_once() -> None:
    bus = EventBus()
    got: list[int] = []
    bus.subscribe(lambda batch: got.append(len(batch)))
    for i in range(3000):
        bus.publish(WarningEvent(t=float(i), code="X", severity="info", message="m",
                                 state="raised"))
    assert bus.drain() == 3000 and got == [3000]
