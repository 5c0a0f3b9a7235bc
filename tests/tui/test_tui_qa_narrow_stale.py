"""QA: on a narrow terminal the active requests say when they are not the latest.

Below 120 columns tab shows the active requests without a frame, and the frame's title
is where "not refreshed: …" is said when the requests could not be fetched (the figures
still could): the rows stood still, ages and all, with no word on screen of why."""

from __future__ import annotations

from tui_support import FIXED_NOW, AdminServer, screen_text, until, until_fetched

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource


async def test_narrow_requests_say_they_are_not_refreshed() -> None:
    srv = AdminServer("saturated")
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.dashboard.requests
            await until_fetched(pilot, lambda: table.row_count == 10, what="the requests")
            await pilot.press("tab")
            await until(pilot, lambda: "r-4400" in screen_text(app), what="the table")
            assert "not refreshed" not in screen_text(app)
            height = table.size.height
            srv.requests_fault = "500"
            assert await app.refresh_now()
            await until(pilot, lambda: "not refreshed" in screen_text(app),
                        what="the word")
            assert "r-4400" in screen_text(app)  # the rows kept
            srv.requests_fault = None
            assert await app.refresh_now()
            await until(pilot, lambda: "not refreshed" not in screen_text(app),
                        what="fresh again")
            await pilot.pause()
            assert table.size.height == height  # no line taken while the rows are fresh
    finally:
        await srv.stop()
