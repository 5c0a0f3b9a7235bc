"""Pilot tests: every key binding of the TUI does what the footer and help say."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from pathlib import Path
from typing import Any

from textual.widgets import Input
from tui_support import (
    FIXED_NOW,
    FixtureSource,
    ReplayFixtureSource,
    busy_workers,
    prompt_open,
    screen_text,
    shows,
    until,
)

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.help import HelpScreen
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.screens.user_detail import UserDetail

WIDE = (160, 48)


def make_app(source: FixtureSource, hz: float = 0.0) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=hz, clock=lambda: FIXED_NOW)


def user_rows(app: LlmtopApp) -> list[str]:
    table = app.dashboard.users
    return [table.user_for(table.coordinate_to_cell_key((i, 0)).row_key) or ""
            for i in range(table.row_count)]


async def test_q_quits() -> None:
    """`q` ends the app with exit code 0 and closes the source."""
    src = FixtureSource()
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    assert src.closed


class TickCountingApp(LlmtopApp):
    """Counts the refresh timer's ticks: paused, a tick must fetch nothing."""

    CSS_PATH = str(Path(inspect.getfile(LlmtopApp)).with_name("app.tcss"))  # not beside here
    ticks = 0

    def _tick(self) -> None:
        self.ticks += 1
        super()._tick()


async def test_p_pauses_fetching_and_shows_paused() -> None:
    """`p` stops fetching and says PAUSED; pressing it again resumes fetching."""
    src = FixtureSource()
    app = TickCountingApp(src, refresh_hz=50.0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: len(src.windows) >= 2)
        await pilot.press("p")
        await shows(pilot, "PAUSED")
        # a fetch the timer started just before p may still be on its way
        await until(pilot, lambda: not busy_workers(app, "refresh"), what="no fetch running")
        frozen = len(src.windows)
        ticks = app.ticks  # 15 ticks of the 50 Hz timer while paused: none fetches
        await until(pilot, lambda: app.ticks >= ticks + 15, what="15 timer ticks")
        assert len(src.windows) == frozen
        await pilot.press("p")
        await until(pilot, lambda: len(src.windows) > frozen, what="fetching again")
        assert "PAUSED" not in screen_text(app)


async def test_w_cycles_windows() -> None:
    """`w` cycles 60 s → 5 min → all → 10 s → 60 s and fetches each window at once."""
    src = FixtureSource()
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        seen = []
        for label in ("window 5 min", "window all", "window 10 s", "window 60 s"):
            await pilot.press("w")
            await shows(pilot, label)
            seen.append(src.windows[-1])
        assert seen == [300, None, 10, 60]
        assert "latency · 10 s" not in screen_text(app)


async def test_s_cycles_sort_column_and_S_reverses() -> None:
    """`s` moves the sort to the next column (user after SLO wraps round); `S` reverses."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        assert "out tok/s ▼" in screen_text(app)
        assert user_rows(app)[0] == "batch-job"
        for _ in range(4):  # TTFT, ITL, SLO, then user (ascending)
            await pilot.press("s")
        await shows(pilot, "user ▲")
        assert user_rows(app) == ["alice", "batch-job", "key:3f9a1c2e"]
        await pilot.press("S")
        await shows(pilot, "user ▼")
        assert user_rows(app) == ["key:3f9a1c2e", "batch-job", "alice"]


async def test_slash_filters_users_enter_keeps_escape_clears() -> None:
    """`/` opens the filter; typing narrows the users (and active requests); enter keeps
    the filter and closes the input; escape in a new filter clears it."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press("a", "l", "i")
        await until(pilot, lambda: user_rows(app) == ["alice"], what="filtered users")
        assert app.dashboard.requests.row_count == 3  # alice's three active requests
        await shows(pilot, "1 of 3 users · filter: ali")
        await pilot.press("enter")
        assert not isinstance(app.focused, Input)
        assert user_rows(app) == ["alice"]
        await pilot.press("slash")
        await pilot.press("escape")
        await until(pilot, lambda: len(user_rows(app)) == 3, what="filter cleared")
        assert not isinstance(app.focused, Input)


async def test_typing_in_the_filter_does_not_trigger_keys() -> None:
    """Letters typed into the filter are text, not commands (q does not quit, p no pause)."""
    app = make_app(ReplayFixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("slash", "q", "p", "w", "space", "plus")
        box = app.dashboard.filter_input
        assert box.value == "qpw +"
        assert app.is_running and not app.paused and app.window_s == 60


async def test_r_starts_recording_with_proposed_name_then_stops() -> None:
    """`r` proposes llmtop-<local time>.jsonl.gz (no directory: the proxy's working
    directory); enter starts recording there (● REC shows); `r` again stops it."""
    src = FixtureSource("low_load")
    app = make_app(src)
    expected = time.strftime("llmtop-%Y%m%d-%H%M%S.jsonl.gz", time.localtime(FIXED_NOW))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert "● REC" not in screen_text(app)
        await pilot.press("r")
        await prompt_open(pilot)
        assert app.screen.query_one("#record-path", Input).value == expected
        await pilot.press("enter")
        await until(pilot, lambda: src.recording_calls == [("start", expected)])
        await shows(pilot, f"● REC {expected}")
        await pilot.press("r")
        await until(pilot, lambda: src.recording_calls[-1] == ("stop", None))
        await until(pilot, lambda: "● REC" not in screen_text(app), what="REC gone")


async def test_r_prompt_escape_cancels() -> None:
    """Escape in the recording prompt starts nothing."""
    src = FixtureSource("low_load")
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RecordPrompt))
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        assert src.recording_calls == []


async def test_tab_moves_focus_between_panels() -> None:
    """`tab` moves focus from the users table to the active requests and back."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert app.focused is app.dashboard.users
        await pilot.press("tab")
        assert app.focused is app.dashboard.requests
        await pilot.press("tab")
        assert app.focused is app.dashboard.users


async def test_tab_at_80_columns_swaps_users_and_requests() -> None:
    """At 80×24 only one table fits: `tab` swaps the users table for the active requests
    and back."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert "r-4400" not in screen_text(app)
        await pilot.press("tab")
        await shows(pilot, "r-4400")
        # the table takes the focus after the screen is drawn again (call_after_refresh),
        # which a loaded machine may not have done when the rows already show
        await until(pilot, lambda: app.focused is app.dashboard.requests,
                    what="the requests table focused")
        assert "key:3f9a1c2e          6" not in screen_text(app)
        await pilot.press("tab")
        await until(pilot, lambda: app.focused is app.dashboard.users)
        assert "r-4400" not in screen_text(app)


async def test_enter_opens_user_detail_and_escape_returns() -> None:
    """`enter` on a user row opens that user's detail (figures and their active requests);
    escape goes back to the dashboard."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        await pilot.press("down")  # second row: alice
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        screen = app.screen
        assert isinstance(screen, UserDetail) and screen.user == "alice"
        await shows(pilot, "user alice")
        await shows(pilot, "402")  # alice's output tok/s
        assert screen.requests.row_count == 3
        text = screen_text(app)
        assert "batch-job" not in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)


async def test_d_toggles_light_and_dark() -> None:
    """`d` switches to the light theme and back, recolouring the panels."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        dark_bad = app.palette.bad
        await pilot.press("d")
        assert app.theme == "textual-light"
        assert app.palette.bad != dark_bad
        await pilot.press("d")
        assert app.theme == "textual-dark"
        assert app.palette.bad == dark_bad


async def test_question_mark_opens_help_and_q_closes_it() -> None:
    """`?` shows the help screen listing the keys; `q` there closes help, not the app."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await shows(pilot, "cycle the window")
        assert "seek 10 s" not in screen_text(app)  # not a replay source
        await pilot.press("q")
        await until(pilot, lambda: app.screen is app.dashboard)
        assert app.is_running


async def test_replay_keys_pause_seek_and_speed() -> None:
    """With a replay source: space pauses/resumes it, ←/→ seek 10 s, +/- change speed;
    the header shows position and speed."""
    src = ReplayFixtureSource("saturated")
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await shows(pilot, "▶ replay 1m00s/5m00s ×1")
        await pilot.press("space")
        assert src.paused
        await shows(pilot, "⏸ replay")
        await pilot.press("space")
        assert not src.paused
        await pilot.press("left", "left", "right")
        assert src.seeks == [-10.0, -10.0, 10.0]
        await shows(pilot, "replay 50s/5m00s")
        await pilot.press("plus")
        assert src.speed == 2.0
        await pilot.press("minus", "minus")
        assert src.speed == 0.5
        await shows(pilot, "×0.5")
        await pilot.press("question_mark")
        await shows(pilot, "seek 10 s back / forward")


async def test_replay_keys_inactive_for_live_sources() -> None:
    """Without replay control, space and ←/→ are not bound (the footer omits them)."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("space", "plus", "left")
        assert app.is_running
        assert "play/pause" not in screen_text(app)
        assert app.check_action("replay_pause", ()) is False


async def test_user_detail_labels_fields_it_does_not_know() -> None:
    """A field the detail screen has no label for is shown in words, an integer as an
    integer and a fraction as a rate."""
    src = FixtureSource("saturated")
    src.snapshot["users"][0]["queue_retries"] = 3
    src.snapshot["users"][0]["odd_rate"] = 2.5
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user("batch-job")
        await shows(pilot, "queue retries")
        text = screen_text(app)
    assert re.search(r"queue retries +3( |$)", text, re.M)
    assert re.search(r"odd rate +2\.50( |$)", text, re.M)


async def test_r_twice_while_the_proxy_answers_sends_one_stop() -> None:
    """A second `r` before the proxy answered the first stop sent another stop (QA: the
    proxy answered it "not recording", an error notification for nothing)."""

    class SlowSource(FixtureSource):
        async def recording(self, action: str, path: str | None) -> dict[str, Any]:
            await asyncio.sleep(0.5)
            return await super().recording(action, path)

    src = SlowSource("low_load")
    src.snapshot["recording"] = {"status": "recording", "path": "x.jsonl.gz"}
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0 and app.recording_active)
        await pilot.press("r", "r", "r")
        await until(pilot, lambda: src.recording_calls == [("stop", None)])
        await until(pilot, lambda: not app.recording_active, what="stopped")
        # a second stop, had one been sent, would be a recording worker of its own: wait
        # for every one to be done
        await until(pilot, lambda: not busy_workers(app, "recording"), what="workers done")
    assert src.recording_calls == [("stop", None)]


def test_the_readmes_keys_are_the_bound_ones() -> None:
    """README.md's "Keys" line names every key the TUI shows in its footer (the app's, the
    dashboard's tab, the users table's and the active requests' enter), and nothing
    else."""
    from textual.binding import Binding

    from llmtop.tui.screens.dashboard import Dashboard
    from llmtop.tui.widgets.requests import RequestsTable
    from llmtop.tui.widgets.users import UsersTable

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Keys", 1)[1].split("\n## ", 1)[0]
    section = re.sub(r"`llmtop[^`]*`|`[^`]*\.jsonl[^`]*`", "", section)  # not keys
    names = {"/": "slash", "?": "question_mark", "←": "left", "→": "right", "+": "plus",
             "-": "minus"}
    documented = {names.get(k, k) for k in re.findall(r"`([^`]+)`", section)}
    bound = set()
    for cls in (LlmtopApp, Dashboard, UsersTable, RequestsTable):
        for b in cls.BINDINGS:
            if isinstance(b, Binding) and b.show:
                bound.add(b.key.split(",")[0])
    assert documented == bound
