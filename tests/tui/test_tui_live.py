"""The TUI against a real admin API over a socket (an aiohttp server on port 0):
live data, a proxy that goes away and comes back, recording control, tokens."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tui_support import FIXED_NOW, AdminServer, prompt_open, screen_text, shows, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource

WIDE = (160, 48)


@pytest.fixture
async def server() -> AsyncIterator[AdminServer]:
    srv = AdminServer("saturated")
    await srv.start()
    yield srv
    await srv.stop()


async def test_live_snapshot_over_socket_shows_users_and_requests(server: AdminServer) -> None:
    """Attached to a real admin API, the screen shows its users, figures and requests."""
    app = LlmtopApp(AdminSource([server.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "batch-job")
        text = screen_text(app)
        assert "1,453 tok/s" in text
        assert "key:3f9a1c2e" in text
        assert "r-4400" in text  # an active request
        assert f"via {server.url}" in text
        assert server.windows[0] == "60"


async def test_disconnected_proxy_shows_disconnected_then_recovers(server: AdminServer) -> None:
    """Server stopped → "DISCONNECTED — retrying" with the last data kept; server back on
    the same port → the banner goes and fresh data arrives."""
    app = LlmtopApp(AdminSource([server.url], timeout_s=5.0), refresh_hz=20,
                    clock=lambda: FIXED_NOW, retry_s=0.1)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "batch-job")
        await server.stop()
        await shows(pilot, "DISCONNECTED — retrying")
        assert "connection refused" in screen_text(app)
        assert "batch-job" in screen_text(app)  # last data stays on screen
        server.snapshot["users"][0]["user"] = "came-back"
        await server.start()
        await shows(pilot, "came-back")
        assert "DISCONNECTED" not in screen_text(app)
        assert app.connected


async def test_starting_with_the_proxy_down_waits_then_connects() -> None:
    """A proxy that is not up yet: the app says disconnected and connects once it is."""
    # Hold a free port with a bound, non-listening socket: connections are refused and
    # no other process can take the port before the server starts on it.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    srv = AdminServer("low_load")
    srv.port = holder.getsockname()[1]
    app = LlmtopApp(AdminSource([srv.url], timeout_s=5.0), refresh_hz=10, retry_s=0.1)
    try:
        async with app.run_test(size=WIDE) as pilot:
            await shows(pilot, "DISCONNECTED")
            text = screen_text(app)
            assert "waiting for the first snapshot" in text
            # nothing is known yet: no green "no warnings", no "collecting data"
            assert "no saturation warnings" not in text and "collecting" not in text
            assert "warnings n/a" in text and "capacity n/a" in text
            holder.close()
            await srv.start()
            await shows(pilot, "alice")
            await shows(pilot, "✓ no saturation warnings")
    finally:
        holder.close()
        await srv.stop()


async def test_recording_key_posts_start_and_stop(server: AdminServer) -> None:
    """`r` + enter POSTs {"action": "start", "path": ...}; the snapshot's recording field
    drives the REC indicator; `r` again POSTs stop."""
    server.snapshot["recording"] = None
    app = LlmtopApp(AdminSource([server.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "batch-job")
        await pilot.press("r")
        await prompt_open(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: len(server.recording_bodies) == 1)
        body = server.recording_bodies[0]
        assert body["action"] == "start"
        assert body["path"].startswith("llmtop-")
        await shows(pilot, "● REC llmtop-")
        await pilot.press("r")
        await until(pilot, lambda: len(server.recording_bodies) == 2)
        assert server.recording_bodies[1] == {"action": "stop"}
        await until(pilot, lambda: "● REC" not in screen_text(app), what="REC gone")


async def test_refused_recording_is_notified_not_crashed(server: AdminServer) -> None:
    """A recording the proxy refuses (HTTP 400) shows its reason in a notification.
    (Each notification is kept as it is made: on a loaded machine one had expired before
    the test looked, once; the source's timeout leaves a slow answer time to come.)"""
    server.snapshot["recording"] = None
    app = LlmtopApp(AdminSource([server.url], timeout_s=10.0), refresh_hz=10,
                    clock=lambda: FIXED_NOW)
    said: list[str] = []
    notify = app.notify

    def keep(message: str, *args: Any, **kwargs: Any) -> None:
        said.append(str(message))
        notify(message, *args, **kwargs)

    app.notify = keep  # type: ignore[method-assign]
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "batch-job")
        await pilot.press("r")
        await prompt_open(pilot)
        box = app.screen.query_one("#record-path")
        box.value = "not-a-recording.txt"  # type: ignore[attr-defined]
        await pilot.press("enter")
        await until(pilot, lambda: len(server.recording_bodies) == 1)
        await until(pilot, lambda: any("path must end in .jsonl" in m for m in said),
                    what="notification")
        assert app.is_running
        assert "● REC" not in screen_text(app)


async def test_token_is_sent_and_a_wrong_one_is_reported() -> None:
    """The admin token goes in Authorization: Bearer; a refused token reads as such."""
    srv = AdminServer("low_load", token="s3cret")
    await srv.start()
    try:
        good = AdminSource([srv.url], token="s3cret")
        snap = await good.fetch(60)
        assert snap["users"][0]["user"] == "alice"
        assert srv.auth[-1] == "Bearer s3cret"
        await good.close()
        app = LlmtopApp(AdminSource([srv.url], token="wrong"), refresh_hz=10, retry_s=0.1)
        async with app.run_test(size=WIDE) as pilot:
            await shows(pilot, "admin token was refused")
    finally:
        await srv.stop()
