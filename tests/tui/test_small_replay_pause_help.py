"""In `llmtop replay` the help said of p "pause / resume the display (the proxy keeps
measuring)": no proxy measures a replay, and what goes on is the replay itself (space
pauses that). The help now says "(the replay plays on)" there — and it does: p holds the
figures while the replay's position moves on."""

from __future__ import annotations

import time
from pathlib import Path

from tui_support import FIXED_NOW, FixtureSource, RealAdmin, screen_text, until

from llmtop.recording.replay import ReplaySource
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.help import HelpScreen


class Wall:
    """The replay's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _recording(path: Path) -> None:
    admin = RealAdmin()
    admin.now = time.time()  # (events a day before the header's start read as damage)
    admin.recorder.start(str(path))
    for k in range(9):
        admin.request(k, f"u{k % 3}")
        admin.now += 10
    admin.recorder.stop()


async def test_replay_help_says_what_p_does_there_and_it_does(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _recording(path)
    wall = Wall()
    src = ReplaySource(path, wall=wall)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        text = screen_text(app)
        assert "pause / resume the display (the replay plays on)" in text
        assert "proxy keeps measuring" not in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard, what="the dashboard")

        await pilot.press("p")
        await pilot.pause()
        held, before = app.view.time, src.position_s
        wall.t += 30  # 30 s with the display paused
        assert not src.paused
        await pilot.press("p")
        await app.refresh_now()
        # resumed: the replay went on meanwhile (30 s in, not where p held it)
        assert src.position_s >= before + 29
        assert app.view.time is not None and held is not None
        assert app.view.time >= held + 29


async def test_live_help_keeps_the_proxy_words() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        text = screen_text(app)
        assert "pause / resume the display (the proxy keeps measuring)" in text
        assert "replay plays on" not in text
