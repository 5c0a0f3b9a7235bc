"""QA: `/` on a narrow terminal while tab shows the active requests in the users' place.

Below 120 columns one table fits, and tab swaps the users table for the active requests.
`/` then focused the filter box inside the hidden users panel: what was typed went into
a box nobody could see, and the requests shrank to one user's with no word on screen of
why (the "filter: …" subtitle is the hidden users panel's). Nor did anything say so once
enter closed the box: narrow, the users panel has no frame for that subtitle."""

from __future__ import annotations

from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp


async def test_the_filter_opens_where_it_can_be_seen() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 40)) as pilot:
        dash = app.dashboard
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("tab")
        await until(pilot, lambda: app.focused is dash.requests, what="the requests shown")
        await pilot.press("slash", *"ali")
        await until(pilot, lambda: dash.filter_input.value == "ali", what="typed")
        await pilot.pause()
        assert app.focused is dash.filter_input
        assert dash.filter_input.region.area > 0  # laid out: on screen, not hidden
        await pilot.press("enter")
        await until(pilot, lambda: app.focused is dash.users, what="the users again")
        await pilot.pause()
        text = screen_text(app)
        assert "alice" in text and "batch-job" not in text
        # no frame for "filter: ali" at this width: the box says it, with the filter set
        assert dash.filter_input.region.area > 0
        assert "ali" in text.replace("alice", "")
        await pilot.press("slash", "escape")
        await until(pilot, lambda: "batch-job" in screen_text(app), what="no filter")
        assert dash.filter_input.region.area == 0
