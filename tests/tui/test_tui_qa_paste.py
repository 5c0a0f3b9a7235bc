"""QA: a paste into the filter or the recording path keeps what could have been typed.

Typed keys are printable, but a paste was taken as it came: an escape sequence in the
clipboard went into the filter and from it to the screen as it was (the users panel's
"filter: …"), and into a recording path sent to the proxy."""

from __future__ import annotations

from textual import events
from textual.widgets import Input
from tui_support import FIXED_NOW, FixtureSource, prompt_open, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt


async def test_a_pasted_filter_loses_its_control_characters() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        box = app.dashboard.filter_input
        await until(pilot, lambda: app.dashboard.users.row_count == 3, what="the users")
        await pilot.press("slash")
        box.post_message(events.Paste("\u202eal\x1b\x07i\tce\nsecond line"))
        await until(pilot, lambda: box.value != "", what="the paste")
        assert box.value == "alice"
        await until(pilot, lambda: app.dashboard.users.row_count == 1, what="filtered")
        text = screen_text(app)
        assert "1 of 3 users · filter: alice" in text
        assert "\x1b" not in text and "\x07" not in text


async def test_a_pasted_recording_path_loses_its_control_characters() -> None:
    src = FixtureSource("low_load")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("r")
        await prompt_open(pilot)
        assert isinstance(app.screen, RecordPrompt)
        box = app.focused
        assert isinstance(box, Input)
        box.clear()  # the proposed name
        box.post_message(events.Paste("rec\x1b[2J\x00.jsonl"))
        await until(pilot, lambda: "rec" in box.value, what="the paste")
        await pilot.press("enter")
        await until(pilot, lambda: src.recording_calls != [], what="the start")
        assert src.recording_calls == [("start", "rec[2J.jsonl")]
