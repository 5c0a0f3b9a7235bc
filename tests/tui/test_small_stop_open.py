"""`r` stopping a recording while requests are open: the notification says how many were
left out (the stop answer's ``open_at_stop``: their records never come, so the recording
ends low), as the admin API's answer and the exit line do. It said only "recording
stopped"."""

from __future__ import annotations

import os
from pathlib import Path

from textual.widgets import Input
from tui_support import FIXED_NOW, RealAdmin, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.source import AdminSource


def _said(app: LlmtopApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _stop_with_open(tmp_path: Path, open_now: int) -> list[str]:
    here = os.getcwd()
    os.chdir(tmp_path)  # the real admin API records relative to its working directory
    admin = RealAdmin()
    admin.recorder.open_count = lambda: open_now  # the proxy's open requests, as wired
    await admin.start()
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.refreshes > 0)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt))
            app.screen.query_one("#record-path", Input).value = "s.jsonl"
            await pilot.press("enter")
            await until(pilot, lambda: admin.recorder.status() is not None, what="recording")
            await pilot.press("r")
            await until(pilot, lambda: any(m.startswith("recording stopped")
                                           for m in _said(app)), what="stopped")
            return [m for m in _said(app) if m.startswith("recording stopped")]
    finally:
        await admin.stop()
        os.chdir(here)


async def test_the_requests_left_out_are_said(tmp_path: Path) -> None:
    assert await _stop_with_open(tmp_path, 3) == [
        "recording stopped; 3 requests still open were left out of it"]


async def test_one_left_out_is_said_in_the_singular(tmp_path: Path) -> None:
    assert await _stop_with_open(tmp_path, 1) == [
        "recording stopped; 1 request still open was left out of it"]


async def test_none_open_says_only_stopped(tmp_path: Path) -> None:
    assert await _stop_with_open(tmp_path, 0) == ["recording stopped"]
