"""QA: the cursor and the view of a table survive a refresh (a live proxy's figures change
at every one, 4 a second).

The active requests' table was rebuilt at each change, and a rebuilt DataTable puts its
cursor on row 0: moved down to a stuck request, the cursor was back on the first row a
quarter of a second later, and enter opened another request. The users table kept its
cursor's user, but the view jumped (scrolled to put that row at the bottom)."""

from __future__ import annotations

import time

from tui_support import FIXED_NOW, RealAdmin, screen_text, until, until_fetched

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.request_detail import RequestDetail
from llmtop.tui.source import AdminSource


def open_request(admin: RealAdmin, rid: str, user: str, age_s: float) -> None:
    admin.active[rid] = ActiveRequest(
        rid, user, "m-8b", "openai", "/v1/chat/completions", True, admin.now - age_s,
        time.perf_counter_ns() - int(age_s * 1e9), concurrency_at_start=1)


def cursor_request(app: LlmtopApp) -> str | None:
    table = app.dashboard.requests
    row = table.request_for(str(table.cursor_row))
    return None if row is None else str(row.get("id"))


async def test_the_requests_cursor_stays_on_its_request(admin: RealAdmin) -> None:
    for i in range(5):
        open_request(admin, f"r-{i}", f"user-{i}", age_s=50.0 - 10 * i)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.dashboard.requests
        await until_fetched(pilot, lambda: table.row_count == 5, what="the requests")
        await pilot.press("tab", "down", "down")
        await until(pilot, lambda: cursor_request(app) == "r-2", what="the cursor on r-2")
        await pilot.pause(0.05)  # the ages move on
        assert await app.refresh_now()
        await pilot.pause()
        assert cursor_request(app) == "r-2"  # was r-0: the cursor back on row 0
        del admin.active["r-0"]  # the oldest ends: r-2 moves up a row
        assert await app.refresh_now()
        await until(pilot, lambda: table.row_count == 4, what="r-0 gone")
        assert table.cursor_row == 1
        assert cursor_request(app) == "r-2"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RequestDetail), what="the modal")
        assert isinstance(app.screen, RequestDetail)
        assert app.screen.key == (None, "r-2")
        del admin.active["r-2"]  # its request ends: the cursor stays on that row
        await pilot.press("escape")
        assert await app.refresh_now()
        await until(pilot, lambda: table.row_count == 3, what="r-2 gone")
        assert cursor_request(app) == "r-3"


async def test_the_users_view_does_not_jump_at_a_refresh() -> None:
    admin = RealAdmin(Config(top_users=150))
    await admin.start()
    try:
        await users_view_kept(admin)
    finally:
        await admin.stop()


async def users_view_kept(admin: RealAdmin) -> None:
    for i in range(150):
        admin.request(i, f"user-{i:03d}", tokens=1 + i % 7)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        users = app.dashboard.users
        await until_fetched(pilot, lambda: users.row_count == 150, what="150 users")
        await pilot.press("pagedown", "pagedown", *["up"] * 8)
        await until(pilot, lambda: users.scroll_y > 0 and users.cursor_row > 0,
                    what="scrolled down")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)
        before = (users.scroll_y, users.cursor_user(), screen_text(app))
        admin.request(1000, "user-149", tokens=3)  # one user's figures change
        assert await app.refresh_now()
        await pilot.pause(0.1)
        after = (users.scroll_y, users.cursor_user(), screen_text(app))
    assert after[:2] == before[:2]
    assert before[1] is not None and before[1] in after[2]
