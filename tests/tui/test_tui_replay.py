"""The TUI driving a real replay: a recording written by llmtop's own recorder, played by
the real ReplaySource on an injected wall clock."""

from __future__ import annotations

import time
from pathlib import Path

from tui_support import FIXED_NOW, RealAdmin, screen_text, shows, until

from llmtop.recording.replay import ReplaySource
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.help import HelpScreen

WIDE = (160, 48)


class Wall:
    """The replay's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def eighty_second_recording(path: Path) -> None:
    """Nine requests 10 s apart (gzipped, so its length is known only once read)."""
    admin = RealAdmin()
    # the records' clock starts at the header's (the real one): the reader drops events
    # a day or more before a recording's start as damaged
    admin.now = time.time()
    admin.recorder.start(str(path))
    for k in range(9):
        admin.request(k, f"u{k % 3}")
        admin.now += 10
    admin.recorder.stop()


def header(app: LlmtopApp) -> str:
    return screen_text(app).splitlines()[0]


async def test_replay_header_keeps_the_length_says_ended_and_shows_the_position_once(
    tmp_path: Path,
) -> None:
    """Seeking back to the start keeps "/1m20s"; at the end the header says "■ replay
    ended" (not ▶); the position is in the replay label only, not again after "via"."""
    path = tmp_path / "s.jsonl.gz"
    eighty_second_recording(path)
    wall = Wall()
    src = ReplaySource(path, wall=wall)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        wall.t += 30
        await app.refresh_now()
        await shows(pilot, "▶ replay 30s/1m20s ×1")
        for _ in range(4):
            await pilot.press("left")
        await shows(pilot, "▶ replay 0s/1m20s ×1")
        line = header(app)
        assert line.rstrip().endswith("│ via s.jsonl.gz") and "0:00" not in line
        wall.t += 200
        await app.refresh_now()
        await shows(pilot, "■ replay ended 1m20s/1m20s ×1")
        assert "▶" not in header(app)


async def test_replay_has_no_recording_key(tmp_path: Path) -> None:
    """A replay cannot record: `r` opens no prompt and `?` does not list it."""
    path = tmp_path / "s.jsonl.gz"
    eighty_second_recording(path)
    app = LlmtopApp(ReplaySource(path, wall=Wall()), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert app.check_action("record", ()) is False
        await pilot.press("r")
        await pilot.pause()
        assert app.screen is app.dashboard
        assert " rec " not in screen_text(app).splitlines()[-1]
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        assert "pause / resume the replay" in text
        assert "start recording" not in text
