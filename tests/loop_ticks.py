"""Latency counted in wake-ups of the event loop, for tests whose client, proxy and upstream
share one (importable from any test folder: pytest puts ``tests/`` on ``sys.path`` for its
``conftest.py``).

A freeze of the whole test process (another job on a shared machine, a slow disk flush, GC)
lasts as long in seconds for every party, so a bound in seconds on "how soon did the proxy
react" fails on it though the proxy did nothing wrong. A 20 ms sleeper on the same loop is
held by the freeze too and never catches up after one: between two instants it counts the
loop's wake-ups, at most one per 20 ms, which a proxy that reacts late (a timer, a poll, a
next-head timeout) runs up while a frozen process does not."""

from __future__ import annotations

import asyncio

TICK_S = 0.02


class LoopTicks:
    """``async with LoopTicks() as ticks: ...``; ``ticks.n`` is the 20 ms sleeps completed
    so far."""

    def __init__(self) -> None:
        self.n = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.n += 1

    async def __aenter__(self) -> LoopTicks:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
