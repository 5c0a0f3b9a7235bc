"""Snapshot tests (pytest-textual-snapshot): the screen drawn from fixed fixtures at
80×24 and 160×48 must match the reviewed SVGs in __snapshots__/. Rendering is
deterministic: every relative time comes from the snapshot's own clock, and the app's
clock is injected. Update after a deliberate change with
`.venv/bin/pytest tests/tui/test_tui_snapshots.py --snapshot-update` and review the SVGs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from tui_support import FIXED_NOW, FixtureSource, ReplayFixtureSource, until

from llmtop.tui.app import LlmtopApp

SnapCompare = Callable[..., bool]
SIZES = [(80, 24), (160, 48)]


def app_for(name: str, source: FixtureSource | None = None) -> LlmtopApp:
    return LlmtopApp(source or FixtureSource(name), refresh_hz=0, clock=lambda: FIXED_NOW)


def after_data(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Wait for the first snapshot, then press ``keys``."""

    async def run(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, LlmtopApp)
        await until(pilot, lambda: app.refreshes > 0)
        if keys:
            await pilot.press(*keys)
        await pilot.pause()

    return run


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_low_load(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """Low load: all green, no warnings, capacity still collecting data."""
    assert snap_compare(app_for("low_load"), terminal_size=size, run_before=after_data())


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_saturated(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """Saturated: red tails, three warnings, KV cache full, simulated GPUs, recording."""
    assert snap_compare(app_for("saturated"), terminal_size=size, run_before=after_data())


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_empty(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """A proxy that just started: n/a everywhere, nothing crashes."""
    assert snap_compare(app_for("empty"), terminal_size=size, run_before=after_data())


def test_many_users_wide(snap_compare: SnapCompare) -> None:
    """150 users with hostile names and 8 GPUs at 200×60: names shown literally."""
    assert snap_compare(app_for("many_users"), terminal_size=(200, 60),
                        run_before=after_data())


def test_help_screen(snap_compare: SnapCompare) -> None:
    """The `?` screen over the dashboard, replay keys included for a replay source."""
    app = app_for("saturated", ReplayFixtureSource("saturated"))
    assert snap_compare(app, terminal_size=(160, 48), run_before=after_data("question_mark"))


def test_user_detail(snap_compare: SnapCompare) -> None:
    """The detail screen of the first user (batch-job) with its active requests."""
    assert snap_compare(app_for("saturated"), terminal_size=(160, 48),
                        run_before=after_data("enter"))


def test_request_detail(snap_compare: SnapCompare) -> None:
    """Enter on the oldest active request (r-4400, waiting): its fields in a modal over
    the dashboard, the engine's id "not named yet"."""
    assert snap_compare(app_for("saturated"), terminal_size=(160, 48),
                        run_before=after_data("tab", "enter"))
