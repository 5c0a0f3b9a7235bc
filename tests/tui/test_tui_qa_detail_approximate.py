"""QA: a user's detail marks the percentiles that are upper bounds, as the users table
does.

attach merges a user's percentiles exactly from each proxy's histograms; from a proxy
that sends none, the row keeps the largest part's value and says ``"approximate":
true``. The users table shows those as "≤5.20 s"; the user's detail showed the same
figures as plain "5.20 s", exact-looking, beside the table's "≤"."""

from __future__ import annotations

import re

from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.user_detail import UserDetail


async def test_the_detail_of_an_approximate_row_marks_its_percentiles() -> None:
    src = FixtureSource("saturated")
    row = src.snapshot["users"][0]
    assert row["user"] == "batch-job"
    row.update(approximate=True, ttft_p99=7.9, e2e_p95=None)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3, what="the users")
        assert "≤5.20 s" in screen_text(app)  # the table's mark
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail), what="the detail")
        await pilot.pause()
        text = screen_text(app)
        assert re.search(r"TTFT p95 +≤5\.20 s", text), text
        assert re.search(r"TTFT p99 +≤7\.90 s", text), text
        assert re.search(r"ITL p95 +≤72\.0 ms", text), text
        assert "≤n/a" not in text  # a missing figure is not a bound
        assert re.search(r"requests +240", text), text  # counts are sums: exact


async def test_an_exact_row_has_no_mark() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3, what="the users")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail), what="the detail")
        await pilot.pause()
        text = screen_text(app)
        assert re.search(r"TTFT p95 +5\.20 s", text), text
        assert "≤" not in text
