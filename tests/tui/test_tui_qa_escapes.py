"""QA: what an admin API says goes on screen shown, never sent to the terminal as it is.

Names and the proxy's own fields were made printable, but not the error an admin API
answers with (whatever listens on that port: its reply's first line went into the header,
the "via" part and the notification), nor the warnings' codes and messages (``attach``
adds its own, PROXY_DOWN, with another proxy's error in them), nor a GPU's name or a
user row's unknown field names. ``ESC ] 0 ;`` retitles the operator's window,
``ESC [ 2 J`` clears the screen."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from tui_support import FIXED_NOW, AdminServer, fixture, screen_text, until, until_fetched

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.source import AdminSource

EVIL = "boom \x1b]0;PWNED\x07\x1b[2J end"
RAW = ("\x1b", "\x07")


class EvilAdmin:
    """An HTTP server on 127.0.0.1 that answers every admin path with an error whose
    text carries escape sequences; or, with ``snapshot`` set, that snapshot."""

    def __init__(self) -> None:
        self.snapshot: dict[str, object] | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        if self.snapshot is not None and request.method == "GET":
            return web.json_response(self.snapshot)
        return web.json_response({"error": EVIL}, status=500)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def evil() -> AsyncIterator[EvilAdmin]:
    srv = EvilAdmin()
    await srv.start()
    yield srv
    await srv.stop()


def shown(app: LlmtopApp) -> str:
    """The screen and every notification's text."""
    return screen_text(app) + "\n".join(n.message for n in app._notifications)


async def test_an_error_reply_is_shown_escaped(evil: EvilAdmin) -> None:
    app = LlmtopApp(AdminSource([evil.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(220, 30)) as pilot:
        await until(pilot, lambda: not app.connected, what="disconnected")
        await until(pilot, lambda: "boom" in screen_text(app), what="the reason")
        text = shown(app)
        assert "DISCONNECTED" in text
        assert "boom \\x1b]0;PWNED\\x07\\x1b[2J end" in text
        assert not any(c in text for c in RAW), repr(text)


async def test_a_refused_recording_is_shown_escaped(evil: EvilAdmin) -> None:
    evil.snapshot = copy.deepcopy(fixture("saturated")["snapshot"])
    evil.snapshot["recording"] = None
    app = LlmtopApp(AdminSource([evil.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until_fetched(pilot, lambda: app.refreshes > 0, what="a snapshot")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RecordPrompt), what="the prompt")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RecordPrompt)
                    and app.screen.problem is not None, what="the prompt again")
        await pilot.pause()
        text = shown(app)
        assert "boom \\x1b]0;PWNED" in text
        assert not any(c in text for c in RAW), repr(text)


async def test_warnings_gpu_names_and_user_fields_are_shown_escaped() -> None:
    srv = AdminServer("saturated")
    srv.snapshot["warnings"] = [{"code": "X\x1b[2JY", "severity": "critical",
                                 "since": FIXED_NOW - 5, "message": EVIL}]
    srv.snapshot["gpus"][0]["name"] = "H100\x1b]0;GPU\x07"
    srv.snapshot["users"][0]["weird\x1b[5m_field"] = 3
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(200, 50)) as pilot:
            await until_fetched(pilot, lambda: "boom" in screen_text(app), what="the warning")
            text = shown(app)
            assert "X\\x1b[2JY" in text and "\\x1b]0;PWNED" in text
            assert "H100\\x1b]0;GPU\\x07" in text
            assert not any(c in text for c in RAW), repr(text)
            app.open_user("batch-job")
            await until(pilot, lambda: isinstance(app.screen, UserDetail), what="the detail")
            await until(pilot, lambda: "weird" in screen_text(app), what="the odd field")
            text = screen_text(app)
            assert "weird\\x1b[5m field" in text
            assert not any(c in text for c in RAW), repr(text)
    finally:
        await srv.stop()
