"""The refresh loop: a timer drives fetches in a worker; slow or overtaken fetches never
show stale data."""

from __future__ import annotations

import asyncio
from typing import Any

from tui_support import FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp


class SlowFirst(FixtureSource):
    """The first fetch hangs until ``gate`` is set and then answers with a user "stale"."""

    def __init__(self) -> None:
        super().__init__("saturated")
        self.gate = asyncio.Event()
        self.calls = 0

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            await self.gate.wait()
            snap = await super().fetch(window_s)
            snap["users"][0]["user"] = "stale"
            return snap
        return await super().fetch(window_s)


async def test_an_overtaken_fetch_is_dropped() -> None:
    """A slow fetch that finishes after a newer one is discarded, not shown."""
    src = SlowFirst()
    app = LlmtopApp(src, refresh_hz=0)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: src.calls == 1)
        assert await app.refresh_now()
        src.gate.set()
        await until(pilot, lambda: not app._fetching, what="the slow fetch to end")
        await pilot.pause()
        assert app.refreshes == 1
        assert "stale" not in screen_text(app)
        assert "batch-job" in screen_text(app)


async def test_timer_keeps_refreshing_by_itself() -> None:
    """With a refresh rate the screen fetches again and again with no key pressed. (How
    close to 20 a second is a timing figure: on a loaded 2-core CI machine one second
    held only two fetches once, so this waits for three however long they take.)"""
    src = FixtureSource("low_load")
    app = LlmtopApp(src, refresh_hz=20)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        start = len(src.windows)
        await until(pilot, lambda: len(src.windows) - start >= 3, what="three timed fetches")
        assert app.refreshes >= 3
