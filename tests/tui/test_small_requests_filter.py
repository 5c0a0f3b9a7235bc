"""`/` filters the users, and with them the active requests: the requests panel said
"active requests" and "N active" all the same, so a filtered list read as every request
open — and narrow, with tab showing the requests in the users' place, nothing on screen
said a filter was set at all. Its title now says "user filter: …" and its subtitle
"n of N active"; narrow, the frameless table gets a top line to carry the title."""

from __future__ import annotations

from rich.text import Text
from textual.content import Content
from tui_support import FIXED_NOW, FixtureSource, fixture, screen_text, until

from llmtop.tui.app import LlmtopApp


def _plain(v: object) -> str:
    return v.plain if isinstance(v, Text) else Content.from_markup(str(v or "")).plain


def _active_users() -> list[str]:
    return [str(r["user"]) for r in fixture("saturated")["requests"]]


async def test_the_requests_panel_says_it_is_filtered_and_by_what() -> None:
    users = _active_users()
    total = len(users)
    mine = sum("ali" in u.casefold() for u in users)
    assert 0 < mine < total  # the fixture has requests the filter hides
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        req = app.dashboard.requests
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        assert _plain(req.border_title) == "active requests"
        assert _plain(req.border_subtitle) == f"{total} active"
        await pilot.press("slash", *"ali", "enter")
        await until(pilot, lambda: req.row_count == mine, what="the requests filtered")
        assert _plain(req.border_title) == "active requests · user filter: ali"
        assert _plain(req.border_subtitle) == f"{mine} of {total} active"
        await pilot.pause()
        assert "active requests · user filter: ali" in screen_text(app)
        # a refresh keeps it said
        await app.refresh_now()
        await pilot.pause()
        assert _plain(req.border_title) == "active requests · user filter: ali"
        assert _plain(req.border_subtitle) == f"{mine} of {total} active"
        await pilot.press("slash", "escape")
        await until(pilot, lambda: req.row_count == total, what="no filter")
        assert _plain(req.border_title) == "active requests"
        assert _plain(req.border_subtitle) == f"{total} active"


async def test_narrow_the_requests_shown_in_the_users_place_say_the_filter() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 40)) as pilot:
        dash = app.dashboard
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("slash", *"ali", "enter")
        await until(pilot, lambda: app.focused is dash.users, what="the users again")
        await pilot.press("tab")
        await until(pilot, lambda: app.focused is dash.requests, what="the requests shown")
        await pilot.pause()
        text = screen_text(app)
        assert dash.users_box.region.area == 0  # the users' "filter: ali" is hidden
        assert "user filter: ali" in text, text
        await pilot.press("tab", "slash", "escape", "tab")
        await until(pilot, lambda: app.focused is dash.requests, what="the requests again")
        await pilot.pause()
        assert "user filter" not in screen_text(app)


async def test_a_hostile_filter_is_shown_as_text() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        req = app.dashboard.requests
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("slash", *"[b]x")
        await until(pilot, lambda: req.filter_text == "[b]x", what="typed")
        assert _plain(req.border_title) == "active requests · user filter: [b]x"
