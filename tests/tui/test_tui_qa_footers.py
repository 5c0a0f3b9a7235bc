"""Every screen's footer says the keys that apply on it, and only those: a modal screen
(the help, the recording prompt) takes every key, so the main screen's footer keys
(q quit, p pause, w window, r rec, …) do nothing there and must not be what it shows."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, ReplayFixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.help import HelpBox, HelpScreen
from llmtop.tui.screens.request_detail import RequestDetail
from llmtop.tui.screens.user_detail import UserDetail

MAIN_KEYS = ("quit", "pause", "window", "rec", "theme", "detail", "panels", "sort",
             "filter", "play", "faster")


def footer(app: LlmtopApp) -> str:
    return screen_text(app).splitlines()[-1]


@pytest.mark.parametrize("size", [(120, 40), (80, 24), (40, 12)],
                         ids=["120x40", "80x24", "40x12"])
@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
async def test_the_help_has_its_own_footer(size: tuple[int, int], replay: bool) -> None:
    """With the help open the footer still showed the dashboard's keys ("q quit …
    p pause w window r rec"): p, w and r did nothing there and q closed the help. The
    help's footer says what applies — esc/q/? close, and ↑↓ scroll where the help is
    taller than its box — and the keys it shows do what it says."""
    src = ReplayFixtureSource("saturated") if replay else FixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "detail" in footer(app), what="the dashboard's footer")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen)
                    and "close" in footer(app), what="the help's footer")
        box = app.screen.query_one(HelpBox)
        overflows = box.max_scroll_y > 0
        await until(pilot, lambda: ("scroll" in footer(app)) == overflows,
                    what=f"'scroll' in the footer exactly when the help overflows ({overflows})")
        line = footer(app)
        assert "esc/q/? close" in line, line
        for key in MAIN_KEYS:
            assert key not in line, (key, line)
        assert overflows == (size[1] <= 12), (size, box.max_scroll_y)
        if overflows:
            await pilot.press("space")
            await until(pilot, lambda: box.scroll_y > 0, what="space scrolls the help")
        await pilot.press("p")  # not a key here: nothing paused behind the help
        await pilot.pause()
        assert not app.paused and isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await until(pilot, lambda: app.screen is app.dashboard)
        assert app.is_running
        await until(pilot, lambda: "detail" in footer(app), what="the dashboard's footer back")


async def test_replay_keys_do_not_reach_behind_the_help() -> None:
    """space, ←/→ and +/- (the replay's keys, priority bindings) still paused, seeked
    and sped the replay behind the help, whose footer does not offer them (space is the
    help's page down). With the help open they are the help's; closed, the replay's."""
    src = ReplayFixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("space", "left", "right", "plus", "minus")
        await pilot.pause()
        assert not src.paused and src.seeks == [] and src.speed == 1.0
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        await pilot.press("space", "right")
        await until(pilot, lambda: src.paused and src.seeks == [10.0],
                    what="the replay's keys on the dashboard")


def _help_text(app: LlmtopApp) -> str:
    return " ".join(screen_text(app).split())


@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
async def test_the_help_opened_in_a_users_detail_lists_the_keys_that_apply_there(
        replay: bool) -> None:
    """Opened from a user's detail the help listed the dashboard's panel keys (sort,
    filter, tab, enter), none of which does anything there, and not the way back."""
    src = ReplayFixtureSource("saturated") if replay else FixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        await pilot.press("question_mark")
        await until(pilot, lambda: "filter users" in _help_text(app), what="the help")
        on_dashboard = _help_text(app)
        assert "filter users" in on_dashboard and "sort users" in on_dashboard
        assert "back to the dashboard" not in on_dashboard
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen)
                    and "pause / resume" in _help_text(app), what="the detail's help")
        in_detail = _help_text(app)
        assert "back to the dashboard" in in_detail, in_detail
        for gone in ("filter users", "sort users", "move focus between panels",
                     "that user's detail"):
            assert gone not in in_detail, (gone, in_detail)
        assert "pause / resume the display" in in_detail  # app keys still apply
        assert ("seek 10 s" in in_detail) == replay
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))


@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
async def test_a_requests_modal_footer_lists_the_replay_keys_that_drive_it(
        replay: bool) -> None:
    """With a request's fields open, space, ←/→ and +/- still pause, seek and speed the
    replay (priority bindings; the modal follows the request through them: a user
    watches it while stepping), but the modal's footer said only "esc/q close". It lists
    them where there is a replay, and they do what it says with the modal staying open;
    live, there are none to list. The help says they work there too."""
    src = ReplayFixtureSource("saturated") if replay else FixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.dashboard.requests.row_count > 0)
        await pilot.press("tab", "enter")
        await until(pilot, lambda: isinstance(app.screen, RequestDetail)
                    and "close" in footer(app), what="the modal's footer")
        line = footer(app)
        assert "esc/q close" in line, line
        listed = ("space play/pause", "← -10 s", "→ +10 s", "+ faster", "- slower")
        for key in listed:
            assert (key in line) == replay, (key, line)
        for key in ("q quit", "p pause", "w window", "r rec", "d theme"):
            assert key not in line, (key, line)  # the main screen's: not the modal's
        if replay:  # in the order of the keys' rows in the help
            assert "esc/q close space play/pause ← -10 s → +10 s + faster - slower" in line
        if not replay:
            return
        assert isinstance(src, ReplayFixtureSource)
        await pilot.press("space", "right", "plus")
        await until(pilot, lambda: src.paused and src.seeks == [10.0] and src.speed == 2.0,
                    what="the replay paused, seeked and sped from the modal")
        assert isinstance(app.screen, RequestDetail)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        assert "(all three in a request's fields too)" in _help_text(app)
