"""The hand-off between the forwarding path and everything that observes it.

``publish`` is what the relay calls once per finished request: an O(1) ``deque.append``
that never blocks, never awaits and is safe from sampler threads. A pump task on the
event loop (or an explicit ``drain()`` in tests and tools) delivers the queued events in
batches to subscribers — the metrics aggregator, the recorder, the warning detectors — so
their work happens on the other side of the hand-off, never per chunk on the relay.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

from llmtop.events import Event
from llmtop.ticks import grid_delay

SLICE_GAP_S = 0.002
"""The least free time the loop gets between two slices of a burst."""
SLICE_REST = 3.0
"""After a slice, the loop is left free for this many times as long as the slice took: in
one-process llmtop the observers share the GIL with the proxy's thread, and a burst of
records then takes at most a quarter of it (256 paced streams: chunk delay p99 +24 ms,
1,500 coalesced, against +36 ms and 5,700 when slices ran back to back)."""

Subscriber = Callable[[Sequence[Event]], None]

PUMP_INTERVAL_S = 0.25
"""How often a running proxy hands its finished requests to the observers. Each wake-up of
a sleeping event loop costs CPU whatever it does (measured here: ~120-170 µs of run time
for an ``asyncio.sleep`` loop on uvloop, main thread or not; ~50 µs for a bare
``time.sleep``): at 20 Hz the pump alone was 1.8 of an idle proxy's 4.3 ms/s, and at 64
paced streams 0.5 µs of CPU per chunk (observers' thread, per-thread run time, 3 runs
each: 2.73-3.21 → 2.34-2.42 µs/chunk). Records reach the metrics at most this much later
— under the TUI's refresh (4 Hz) and the 0.5 s tick that attributes live tokens; open
requests are read live from the registry and do not wait for it."""

SLICE_EVENTS = 32
"""Events the pump hands over per loop turn: a 32-record slice costs the observers about
3–6 ms on a busy 2-core machine, and an admin request arriving meanwhile waits for it
(soak, admin p99 over 60 s at 10 Hz: 256 → 0.4–1 s on the proxy's loop; 64 → 45–61 ms
on the observers' own loop; 32 → 36–37 ms)."""


class EventBus:
    """Fan-out of events in batches. Subscribers run in order; one failing does not stop
    the others (its error is counted and kept for ``last_error``)."""

    def __init__(self) -> None:
        self._queue: deque[Event] = deque()
        self._subscribers: list[Subscriber] = []
        self.delivered = 0
        self.subscriber_errors = 0
        self.last_error: BaseException | None = None

    def publish(self, event: Event) -> None:
        self._queue.append(event)

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def unsubscribe(self, fn: Subscriber) -> None:
        if fn in self._subscribers:
            self._subscribers.remove(fn)

    def pending(self) -> int:
        return len(self._queue)

    def drain(self, max_events: int | None = None) -> int:
        """Deliver everything queued so far (at most ``max_events`` of it, oldest first);
        returns how many events were delivered."""
        q = self._queue
        if not q:
            return 0
        pop = q.popleft
        n = len(q) if max_events is None else min(len(q), max_events)
        batch: list[Event] = [pop() for _ in range(n)]
        for fn in list(self._subscribers):
            try:
                fn(batch)
            except Exception as exc:  # a broken observer must never take the proxy down
                self.subscriber_errors += 1
                self.last_error = exc
        self.delivered += len(batch)
        return len(batch)

    async def pump(self, interval_s: float = 0.05, slice_events: int = SLICE_EVENTS) -> None:
        """Drain every ``interval_s`` until cancelled; drains once more on the way out.

        A burst (a thousand streams ending in one engine step) is delivered in slices of
        ``slice_events``; after each slice the loop is left free for ``SLICE_REST`` times as
        long as the slice took (at least ``SLICE_GAP_S``). An admin request takes several
        loop turns (read, handler, snapshot, write): with a bare yield it waited for a slice
        at every turn, now for one slice at most. The records of a burst reach the metrics
        a little later instead (a 1,024-record burst: about a second)."""
        clock = time.perf_counter
        loop = asyncio.get_running_loop()
        try:
            while True:
                # on the loop's shared grid: the metrics tick and the samplers wake with it
                await asyncio.sleep(grid_delay(loop.time(), interval_s))
                while True:
                    t = clock()
                    if self.drain(slice_events) < slice_events:
                        break
                    await asyncio.sleep(max(SLICE_GAP_S, SLICE_REST * (clock() - t)))
        finally:
            self.drain()
