"""``run`` and ``demo`` end their TUI when a child process dies by setting the app's
``stop`` event from their watcher thread (they sent themselves SIGTERM, whose
KeyboardInterrupt can land where Textual or asyncio catches it: in the full suite the TUI
once ran on for 30 s after its proxy was killed)."""

from __future__ import annotations

import threading

from tui_support import FixtureSource, until

from llmtop.tui.app import LlmtopApp


async def test_setting_stop_from_another_thread_ends_the_app_as_q_does() -> None:
    src = FixtureSource()
    stop = threading.Event()
    app = LlmtopApp(src, refresh_hz=4.0, stop=stop)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert app.is_running
        threading.Thread(target=stop.set).start()
        await until(pilot, lambda: not app.is_running, limit_s=10)
    assert app.return_code == 0
    assert src.closed


async def test_a_stop_set_before_the_app_runs_ends_it_at_once() -> None:
    """The child may die while the TUI is still starting."""
    src = FixtureSource()
    stop = threading.Event()
    stop.set()
    app = LlmtopApp(src, refresh_hz=4.0, stop=stop)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.is_running, limit_s=10)
    assert app.return_code == 0


async def test_without_a_stop_event_the_app_runs_on() -> None:
    src = FixtureSource()
    app = LlmtopApp(src, refresh_hz=20.0)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.refreshes > 3)
        assert app.is_running
