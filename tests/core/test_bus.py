"""The hand-off: publish never blocks, drain delivers batches, a broken observer is contained."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llmtop.bus import EventBus
from llmtop.events import Event, WarningEvent


def ev(i: int) -> WarningEvent:
    return WarningEvent(t=float(i), code="X", severity="warning", message="m", state="raised")


def test_drain_delivers_in_order_to_every_subscriber() -> None:
    bus = EventBus()
    got_a: list[Event] = []
    got_b: list[Event] = []
    bus.subscribe(got_a.extend)
    bus.subscribe(got_b.extend)
    for i in range(5):
        bus.publish(ev(i))
    assert bus.pending() == 5
    assert bus.drain() == 5
    assert [e.t for e in got_a] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
    assert got_a == got_b
    assert bus.drain() == 0


def test_failing_subscriber_does_not_stop_others() -> None:
    bus = EventBus()
    good: list[Event] = []

    def bad(batch: Sequence[Event]) -> None:
        raise RuntimeError("observer bug")

    bus.subscribe(bad)
    bus.subscribe(good.extend)
    bus.publish(ev(1))
    bus.drain()
    assert len(good) == 1
    assert bus.subscriber_errors == 1
    assert isinstance(bus.last_error, RuntimeError)


async def test_pump_drains_periodically_and_on_cancel() -> None:
    bus = EventBus()
    got: list[Event] = []
    bus.subscribe(got.extend)
    task = asyncio.create_task(bus.pump(0.01))
    bus.publish(ev(1))
    await asyncio.sleep(0.05)
    assert len(got) == 1
    bus.publish(ev(2))
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert len(got) == 2
