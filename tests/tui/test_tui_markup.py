"""User-controlled strings are shown as text, never interpreted as markup; odd or
missing fields render as n/a instead of crashing."""

from __future__ import annotations

import copy
from typing import Any

from tui_support import FIXED_NOW, FixtureSource, screen_text, shows, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.user_detail import UserDetail

WIDE = (200, 60)
HOSTILE = "[bold red]x[/]"


def make_app(source: FixtureSource) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)


async def test_hostile_user_names_models_and_warnings_show_literally() -> None:
    """A user named "[bold red]x[/]", one named "<script>…", a model "[red]model[/red]"
    and a warning message with markup all appear character for character."""
    app = make_app(FixtureSource("many_users"))
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("s", "s", "s", "s")  # sort by user: the bracketed names first
        await shows(pilot, HOSTILE)
        text = screen_text(app)
        assert "<script>alert(1)</script>" in text
        assert "[red]model[/red]" in text
        assert "GPU 3 memory 97% [bold]used[/bold] <b>" in text
        assert "(empty)" in text  # the user with an empty id


async def test_hostile_user_detail_and_filter() -> None:
    """The detail screen of "[bold red]x[/]" titles it literally; filtering by "[b"
    (which would open a markup tag) narrows the list without error."""
    src = FixtureSource("many_users")
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user(HOSTILE)
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        await shows(pilot, f"user {HOSTILE}")
        await shows(pilot, f"active requests of {HOSTILE}")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        await pilot.press("slash", "[", "b")
        await until(pilot, lambda: app.dashboard.users.row_count == 1)
        await shows(pilot, "filter: [b")


def garbage(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with every section replaced by something of the wrong type."""
    snap = copy.deepcopy(snapshot)
    snap.update({
        "time": "yesterday", "uptime_s": None, "upstream": 12,
        "system": {"rps": "lots", "output_tps": None, "in_flight": [], "errors": {}},
        "latency": {"ttft": {"p50": "1s", "p95": float("nan")}, "itl": None, "e2e": 3},
        "users": [{"user": None, "requests": "x"}, "bob", 7, {"output_tps": True}],
        "gpus": [{"index": "zero", "mem_used_bytes": -1, "mem_total_bytes": 0}, None],
        "engine": "vllm", "capacity": [], "warnings": [{"since": "then"}, "oops"],
        "slo": {"ttft_s": "fast"}, "recording": 42, "series": [{"t": 1}, 3, None],
    })
    return snap


async def test_wrong_types_everywhere_render_na_without_crashing() -> None:
    """A snapshot whose every field has the wrong type still draws, with n/a."""
    src = FixtureSource("saturated")
    src.snapshot = garbage(src.snapshot)
    src.requests = [{"id": None, "age_s": "old"}, "x"]  # type: ignore[list-item]
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
        assert "RPS n/a" in text
        assert "max concurrency at SLO: collecting data…" in text
        assert "engine n/a" in text
        assert app.is_running and app.connected


async def test_minimal_snapshot_renders() -> None:
    """A snapshot with only a version renders (every panel says n/a)."""
    src = FixtureSource("empty")
    src.snapshot = {"version": 1}
    src.requests = []
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await shows(pilot, "RPS n/a")
        assert "GPU n/a" in screen_text(app)


async def test_a_source_that_raises_unexpectedly_reads_as_disconnected() -> None:
    """A source bug (an exception other than SourceUnavailable) shows as disconnected
    with its message, and the app keeps running."""

    class Broken(FixtureSource):
        async def fetch(self, window_s: int | None) -> dict[str, Any]:
            raise RuntimeError("decoder exploded")

    app = make_app(Broken("low_load"))
    async with app.run_test(size=(160, 48)) as pilot:
        await shows(pilot, "RuntimeError: decoder exploded")
        assert not app.connected and app.is_running
