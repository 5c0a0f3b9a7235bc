"""A user named "other" in the TUI, against llmtop's own admin API on a socket: its own
row, next to the row "(others)" of the users past the top N, and each opens its own
detail (the user's requests, or the folded users')."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from tui_support import FIXED_NOW, RealAdmin, screen_text, shows, until

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.source import AdminSource
from llmtop.tui.widgets.users import FOLD_KEY

WIDE = (160, 48)


@pytest.fixture
async def admin() -> AsyncIterator[RealAdmin]:
    srv = RealAdmin(Config(top_users=2))
    await srv.start()
    yield srv
    await srv.stop()


async def test_a_user_named_other_is_a_row_apart_from_the_fold(admin: RealAdmin) -> None:
    for i, user in enumerate(["alice", "other", "other", "carl", "dora", "dora"]):
        admin.request(i, user, tokens=10 + i)
    start = time.perf_counter_ns() - 2 * 10**9
    for rid, user in (("live-of-other", "other"), ("live-of-carl", "carl")):
        admin.active[rid] = ActiveRequest(
            rid, user, "m", "openai", "/v1/chat/completions", True, admin.now - 2, start
        )
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 3, what="3 rows")
        names = [
            table.user_for(table.coordinate_to_cell_key((i, 0)).row_key)
            for i in range(table.row_count)
        ]
        assert sorted(names[:2]) == ["alice", "other"] and names[2] == FOLD_KEY
        cells = [table.get_cell_at((i, 0)).plain for i in range(3)]
        assert cells[2] == "(others)" and "other" in cells[:2]
        assert str(app.dashboard.users_box.border_subtitle) == "top 2 users + ≈2 others"

        table.move_cursor(row=names.index("other"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail), what="detail")
        await shows(pilot, "active requests of other")
        text = screen_text(app)
        assert "live-of-other" in text and "live-of-carl" not in text
        assert "every user past" not in text
        row = app.view.user("other")
        assert row is not None and row["tracked"] is True and row["requests"] == 2

        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, UserDetail), what="back")
        table.move_cursor(row=2)
        await pilot.press("enter")
        await shows(pilot, "every user past the top 2, in one row")
        text = screen_text(app)
        assert "active requests of (others)" in text
        assert "live-of-carl" in text and "live-of-other" not in text
        fold = app.view.user(FOLD_KEY)
        assert fold is not None and fold["tracked"] is False and fold["requests"] == 3
