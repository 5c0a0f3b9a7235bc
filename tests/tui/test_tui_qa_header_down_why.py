"""QA: while the proxy is down, the header's first line keeps the window and why.

With a token the admin API refuses, line 1 was "DISCONNECTED — retrying (http://127.0.0.1:
PORT: HTTP 401: the admin token was refused)" cut at its end: at 100 columns the window
read "window …", at 80 the reason stopped at "the admin token …" and the window was gone,
at 60 only the proxy's address was left of the reason ("(http://127…"), at 40 not even
that. The address (named by "via" where there is room) now goes first, then the reason
is cut to the room left, then it goes; the window stays, as it does at every width when
connected."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, AdminServer, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource


@pytest.mark.parametrize(("size", "why"), [
    ((160, 30), "(http://127.0.0.1:{port}: HTTP 401: the admin token was refused)"),
    ((100, 30), "(HTTP 401: the admin token was refused)"),
    ((80, 24), "(HTTP 401: the a"),
    ((60, 20), "(HTTP 401: the"),
    ((40, 12), "DISCONNECTED"),
])
async def test_a_refused_token_leaves_the_window_and_why_in_view(
        size: tuple[int, int], why: str) -> None:
    srv = AdminServer("saturated", token="s3cret")
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=size) as pilot:
            await app.refresh_now()
            await until(pilot, lambda: "DISCONNECTED" in screen_text(app),
                        what="DISCONNECTED")
            line1 = screen_text(app).splitlines()[0]
            assert line1.lstrip().startswith(("DISCONNECTED", "llmtop │ DISCONNECTED")), line1
            assert "window 60 s" in line1, line1
            assert why.format(port=srv.port) in line1, line1
    finally:
        await srv.stop()


async def test_a_down_fixture_keeps_its_whole_reason_where_it_fits() -> None:
    """A reason that is not an address and why (a replay's, a source's own words) is
    kept whole where it fits: the recording's path gives way first ("● REC" stays)."""
    src = FixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        src.down = True
        await app.refresh_now()
        await pilot.pause()
        line1 = screen_text(app).splitlines()[0]
        assert "DISCONNECTED — retrying (fixture source is down)" in line1, line1
        assert "window 60 s" in line1 and "● REC" in line1, line1
