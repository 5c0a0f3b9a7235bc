"""`p` pauses the display ("the proxy keeps measuring"). But `r` (start/stop recording)
while paused fetched and showed a whole new snapshot: the figures the user had paused on
were replaced by the latest, with the header still saying PAUSED. And a timer fetch on its
way when p was pressed was shown when it landed. Paused, the figures now stay as they
were; r still records, and the header's ● REC (and so what the next r does, stop) follows
the proxy; the header says the time of the figures held: "PAUSED at HH:MM:SS"."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input
from tui_support import FIXED_NOW, FixtureSource, RealAdmin, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.source import AdminSource


def _users(app: LlmtopApp) -> set[str]:
    return {str(u.get("user")) for u in app.view.items("users")}


def _at(t: float) -> str:
    return f"PAUSED at {time.strftime('%H:%M:%S', time.localtime(t))}"


async def test_recording_while_paused_keeps_the_figures_and_shows_rec(tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)  # the real admin API records relative to its working directory
    admin = RealAdmin()
    await admin.start()
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=4, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            admin.request(1, "alice")
            await until(pilot, lambda: "alice" in _users(app), what="alice shown")
            await pilot.press("p")
            await until(pilot, lambda: "PAUSED" in screen_text(app), what="paused")
            held = app.view.time
            assert held is not None
            await until(pilot, lambda: _at(held) in screen_text(app), what="PAUSED at T")

            admin.now += 30
            admin.request(2, "bob")
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RecordPrompt), what="prompt")
            app.screen.query_one("#record-path", Input).value = "paused.jsonl"
            await pilot.press("enter")
            await until(pilot, lambda: "● REC" in screen_text(app), what="REC shown")
            assert admin.recorder.status() is not None
            assert (tmp_path / "paused.jsonl").exists()
            assert app.view.time == held and _users(app) == {"alice"}
            text = screen_text(app)
            assert _at(held) in text and "bob" not in text

            await pilot.press("r")  # the view says recording: r stops it, no prompt
            await until(pilot, lambda: "● REC" not in screen_text(app), what="REC gone")
            assert not isinstance(app.screen, RecordPrompt)
            assert admin.recorder.status() is None
            assert app.view.time == held and _users(app) == {"alice"}

            await pilot.press("p")
            await until(pilot, lambda: "bob" in _users(app), what="live again")
            assert app.view.time != held
            assert "PAUSED" not in screen_text(app)
    finally:
        await admin.stop()
        os.chdir(here)


class GatedSource(FixtureSource):
    """A fixture whose fetches wait for ``gate`` once it is cleared (a slow proxy), each
    answering a later ``time``."""

    def __init__(self) -> None:
        super().__init__("saturated")
        self.gate = asyncio.Event()
        self.gate.set()
        self.t = FIXED_NOW

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        await self.gate.wait()
        self.t += 1.0
        self.snapshot["time"] = self.t
        return await super().fetch(window_s)


async def test_a_fetch_landing_after_p_is_not_shown() -> None:
    src = GatedSource()
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        held = app.view.time
        src.gate.clear()
        await pilot.press("w")  # a fetch for the next window, held on its way
        await until(pilot, lambda: app._fetching, what="fetching")
        await pilot.press("p")
        src.gate.set()
        await until(pilot, lambda: not app._fetching, what="the fetch landed")
        await pilot.pause()
        assert app.view.time == held
        assert _at(held) in screen_text(app)
        await pilot.press("p")  # resumed: the window asked for is fetched and shown
        await until(pilot, lambda: app.view.time != held, what="the figures move on")
        assert "PAUSED" not in screen_text(app)


@pytest.mark.parametrize(("size", "timed"), [((40, 12), False), ((160, 40), True)])
async def test_paused_at_gives_way_to_plain_paused_where_narrow(size: tuple[int, int],
                                                                timed: bool) -> None:
    """The time beside PAUSED is the first thing the state gives up: at 40 columns PAUSED
    and the window still show; at 160 the time too."""
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("p")
        await until(pilot, lambda: "PAUSED" in screen_text(app).splitlines()[0],
                    what="PAUSED in line 1")
        line1 = screen_text(app).splitlines()[0]
        assert "window" in line1, line1
        assert (_at(FIXED_NOW) in line1) is timed, line1
