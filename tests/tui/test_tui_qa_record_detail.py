"""QA: the `r` prompt opened again after a refused name, from a user's detail too.

r works in a user's detail as on the dashboard. A name the proxy refused there (no
.jsonl suffix) opened nothing again: the refusal was a notification for a few seconds,
the name typed was lost, and r proposed the timestamp again; on the dashboard the prompt
opens again with the name and the reason (test_tui_qa_record). It now does so over the
screen r was pressed on, wherever that was, as long as that screen is still on top."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from textual.widgets import Input
from tui_support import FIXED_NOW, RealAdmin, busy_workers, prompt_open, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.source import AdminSource

WHY = "must end in .jsonl or .jsonl.gz"


async def test_a_refused_name_in_a_users_detail_opens_the_prompt_again(
        tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)  # the real admin API records relative to its working directory
    admin = RealAdmin()
    await admin.start()
    admin.request(1, "alice")
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.dashboard.users.row_count == 1, what="alice")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, UserDetail), what="the detail")
            detail = app.screen
            await pilot.press("r")
            await prompt_open(pilot)
            app.screen.query_one("#record-path", Input).value = "incident-db"
            await pilot.press("enter")
            await until(pilot, lambda: not busy_workers(app, "recording"),
                        what="the proxy's answer")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt)
                        and WHY in screen_text(app),
                        what="the prompt again over the detail, with why")
            assert app.screen.query_one("#record-path", Input).value == "incident-db"
            assert admin.recorder.status() is None
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is detail, what="back in the detail")
    finally:
        await admin.stop()
        os.chdir(here)


class GatedSource(AdminSource):
    """The real admin source whose recording requests wait for :attr:`gate` (the proxy's
    answer held back while the reader moves on)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls)
        self.gate = asyncio.Event()

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        await self.gate.wait()
        return await super().recording(action, path)


async def test_a_refusal_after_leaving_the_screen_is_only_a_notification(
        tmp_path: Path) -> None:
    """The prompt does not come back over another screen than the one r was pressed on
    (the reader went back to the dashboard while the proxy answered): the notification
    alone says why."""
    here = os.getcwd()
    os.chdir(tmp_path)
    admin = RealAdmin()
    await admin.start()
    admin.request(1, "alice")
    source = GatedSource([admin.url])
    app = LlmtopApp(source, refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.dashboard.users.row_count == 1, what="alice")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, UserDetail), what="the detail")
            await pilot.press("r")
            await prompt_open(pilot)
            app.screen.query_one("#record-path", Input).value = "incident-db"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, UserDetail), what="prompt gone")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.dashboard, what="the dashboard")
            source.gate.set()
            await until(pilot, lambda: not busy_workers(app, "recording"),
                        what="the proxy's answer")
            await until(pilot, lambda: any(WHY in n.message for n in app._notifications),
                        what="the notification")
            await pilot.pause(0.3)
            assert app.screen is app.dashboard
    finally:
        await admin.stop()
        os.chdir(here)
