"""QA: the `r` prompt and a name the proxy refuses.

The admin API takes only .jsonl/.jsonl.gz names (and a directory that exists). Typing
`incident-db` and enter closed the prompt and the refusal showed as a notification for a
few seconds: nothing recorded, the typed name gone, `r` proposed the timestamp again. The
prompt now opens again with the name typed and the proxy's reason; a corrected name then
starts the recording, escape still cancels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import Input
from tui_support import FIXED_NOW, RealAdmin, busy_workers, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.source import AdminSource


@pytest.mark.parametrize(("typed", "why"), [
    ("incident-db", "must end in .jsonl or .jsonl.gz"),
    ("no-such-dir/incident.jsonl", "directory does not exist"),
])
async def test_a_refused_name_opens_the_prompt_again_with_the_reason(
        typed: str, why: str, tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)  # the real admin API records relative to its working directory
    admin = RealAdmin()
    await admin.start()
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.refreshes > 0)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt))
            app.screen.query_one("#record-path", Input).value = typed
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt)
                        and why in screen_text(app), what="the prompt again, with why")
            box = app.screen.query_one("#record-path", Input)
            assert box.value == typed
            assert admin.recorder.status() is None

            box.value = "incident-db.jsonl.gz"  # corrected: the reason goes, it records
            await until(pilot, lambda: why not in screen_text(app), what="the reason gone")
            assert why not in screen_text(app)
            await pilot.press("enter")
            await until(pilot, lambda: "● REC" in screen_text(app), what="REC shown")
            assert not isinstance(app.screen, RecordPrompt)
            assert (tmp_path / "incident-db.jsonl.gz").exists()
    finally:
        await admin.stop()
        os.chdir(here)


async def test_escape_cancels_the_prompt_opened_again(tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)
    admin = RealAdmin()
    await admin.start()
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.refreshes > 0)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt))
            app.screen.query_one("#record-path", Input).value = "x.txt"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt)
                        and "must end in" in screen_text(app))
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.dashboard)
            # a start, had escape sent one, would be a recording worker, and the proxy
            # would have it by the time the worker is done: wait for none to run, and for
            # two snapshots more (one asked for after any such start)
            seen = app.refreshes
            await until(pilot, lambda: app.refreshes >= seen + 2
                        and not busy_workers(app, "recording"),
                        what="two snapshots more, no recording start on its way")
            assert app.screen is app.dashboard and admin.recorder.status() is None
    finally:
        await admin.stop()
        os.chdir(here)


@pytest.mark.parametrize("size", [(100, 30), (60, 16), (40, 12)])
async def test_the_prompt_says_the_suffixes_whole_at_any_width(size: tuple[int, int]) -> None:
    """The prompt's one line of help was cut at the box's edge, not wrapped: at 100
    columns it read "… working directory (.jsonl or .j", the rule the proxy enforces and
    "enter to start" both gone."""
    from textual.containers import Vertical
    from tui_support import FixtureSource

    src = FixtureSource("saturated")
    src.snapshot["recording"] = None
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RecordPrompt))

        def boxed() -> str:
            """The words in the prompt's box as drawn now."""
            box = app.screen.query_one(Vertical).region
            rows = screen_text(app).splitlines()[box.y + 1: box.bottom - 1]
            return " ".join(r[box.x + 1: box.right - 1].strip() for r in rows)

        await until(pilot, lambda: "enter to start:" in boxed(), what="the prompt drawn")
        text = boxed()
    assert ".jsonl or .jsonl.gz); enter to start:" in text, text


@pytest.mark.parametrize("size", [(100, 30), (40, 12)])
async def test_the_footer_in_the_prompt_says_what_applies_there(size: tuple[int, int]) -> None:
    """With the prompt open the footer still showed the main screen's keys ("q quit",
    "p pause", "w window", …), none of which applies while typing a name: q types a q.
    The prompt has its own footer now: enter starts, escape cancels."""
    from tui_support import FixtureSource

    src = FixtureSource("saturated")
    src.snapshot["recording"] = None
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "quit" in screen_text(app).splitlines()[-1],
                    what="the dashboard's footer")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RecordPrompt)
                    and "cancel" in screen_text(app).splitlines()[-1],
                    what="the prompt's footer")
        footer = screen_text(app).splitlines()[-1]
        assert "start" in footer and "esc" in footer, footer
        for main_key in ("quit", "pause", "window", "rec", "theme", "detail", "panels"):
            assert main_key not in footer, footer
        await pilot.press("q")  # types a q: the app is still there, the box has it
        await until(pilot, lambda: app.screen.query_one("#record-path", Input).value
                    .endswith("q"), what="q typed")
        assert isinstance(app.screen, RecordPrompt) and app.is_running
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        await until(pilot, lambda: "quit" in screen_text(app).splitlines()[-1],
                    what="the dashboard's footer back")
