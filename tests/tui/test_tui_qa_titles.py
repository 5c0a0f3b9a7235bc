"""The panels' titles say what their figures are over: the latency panel its window from
the first snapshot on."""

from __future__ import annotations

from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp

SIZE = (120, 40)


async def test_the_first_snapshot_keeps_its_window_in_the_latency_title() -> None:
    """The dashboard's on_mount set the titles after the first snapshot could have been
    shown, overwriting "latency · 60 s" with "latency": figures with no window named
    until the next refresh (paused, or refresh 0: never)."""
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "latency · 60 s" in screen_text(app), limit_s=5,
                    what="the latency panel's window in its title")
