"""The panels' titles say what their figures are over: the latency panel its window from
the first snapshot on, the plots how long they span and that their figures are the
latest point's, not the window's (which the header and the latency panel show)."""

from __future__ import annotations

from tui_support import FIXED_NOW, AdminServer, FixtureSource, screen_text, until, until_fetched

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource

SIZE = (120, 40)


async def test_the_first_snapshot_keeps_its_window_in_the_latency_title() -> None:
    """The dashboard's on_mount set the titles after the first snapshot could have been
    shown, overwriting "latency · 60 s" with "latency": figures with no window named
    until the next refresh (paused, or refresh 0: never)."""
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "latency · 60 s" in screen_text(app),
                    what="the latency panel's window in its title")


async def test_the_plots_say_their_figures_are_the_latest_points() -> None:
    """Over a real admin socket: the plots' "output tok/s", "TTFT p95" figures are the
    series' latest point (a 1 s or 2 s bucket) and differ from the same names over the
    window in the header and the latency panel ("1,453 tok/s" beside "out tok/s
    1,430"); the panel was titled only "last minutes". It says the span and the step."""
    server = AdminServer("saturated")
    series = server.snapshot["series"]
    step = series[1]["t"] - series[0]["t"]
    span = series[-1]["t"] - series[0]["t"] + step
    await server.start()
    try:
        app = LlmtopApp(AdminSource([server.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until_fetched(pilot, lambda: app.refreshes > 0)
            caption = f"last {fmt.duration(span)} · figures: latest {fmt.duration(step)}"
            await until(pilot, lambda: caption in screen_text(app),
                        what=repr(caption))
            assert app.dashboard.plots.border_title == caption
    finally:
        await server.stop()


async def test_without_a_series_the_plots_keep_their_plain_title() -> None:
    """A source whose snapshots carry no series (the panel keeps its own history of the
    window's figures): no step to name."""
    src = FixtureSource("saturated")
    src.snapshot.pop("series", None)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "last minutes" in screen_text(app),
                    what="the plain title")
