"""QA (3 a.m., a tmux pane of 40×12): the saturation warnings must stay on screen.

The users table takes the focus at start, so on a terminal too short for every panel the
screen scrolls down to it; the header was docked so it stays, but the warnings bar scrolled
off the top with the panes: a critical SLO_TTFT was raised and nothing on screen said so."""

from __future__ import annotations

import re

import pytest
from tui_support import FIXED_NOW, FixtureSource, after_keys, focused_row, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.user_detail import UserDetail


def make_app(source: FixtureSource) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)


@pytest.mark.parametrize("size", [(40, 12), (60, 20), (41, 13)])
async def test_warnings_stay_on_screen_at_tiny_sizes(size: tuple[int, int]) -> None:
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "batch-job" in screen_text(app), 10, "the users")
        lines = screen_text(app).splitlines()
        assert "✖ SLO_TTFT" in lines[2], "\n".join(lines)
        # the users table is still reachable, and moving about does not lose the warning
        assert any("batch-job" in x for x in lines), "\n".join(lines)
        await pilot.press("tab", "down", "down", "down")
        await after_keys(pilot, lambda: app.focused is app.dashboard.requests
                         and focused_row(app) == 3, "the requests' cursor on row 3")
        lines = screen_text(app).splitlines()
        assert "window 60 s" in lines[0], "\n".join(lines)
        assert "✖ SLO_TTFT" in lines[2], "\n".join(lines)


async def test_no_warnings_line_stays_too() -> None:
    """Nothing raised: "✓ no saturation warnings" is what stays, not an empty gap."""
    src = FixtureSource("saturated")
    src.snapshot["warnings"] = []
    app = make_app(src)
    async with app.run_test(size=(40, 12)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "no saturation warnings" in screen_text(app), 10,
                    "the warnings bar")
        lines = screen_text(app).splitlines()
    assert "✓ no saturation warnings" in lines[2], "\n".join(lines)


@pytest.mark.parametrize("size", [(40, 12), (60, 20)])
async def test_a_short_terminal_at_start_gets_the_short_warnings_bar(
        size: tuple[int, int]) -> None:
    """Started in a short terminal, the bar was measured before the screen had its
    "-short" class and kept one line per warning (3 of 12 lines) instead of the two
    a short terminal gets: the worst warning, then "+2 more: …"."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        # laid out again after the first refresh (a fixed 0.2 s pause was too short on a
        # busy machine): wait for the short bar, which never came before the fix
        await until(pilot, lambda: "+2 more" in screen_text(app), 10, "the short bar")
        lines = screen_text(app).splitlines()
        height = app.dashboard.warnings.size.height
    assert "✖ SLO_TTFT" in lines[2], "\n".join(lines)
    assert "+2 more: QUEUEING, KV_CACHE" in lines[3], "\n".join(lines)
    assert height == 2


def request_rows(lines: list[str]) -> list[str]:
    """The active requests' rows on screen (their state is a word of their own)."""
    return [ln for ln in lines if re.search(r"\b(waiting|streaming)\b", ln)]


@pytest.mark.parametrize("size", [(40, 12), (40, 9), (60, 10), (41, 13), (40, 7)])
async def test_user_detail_keeps_a_request_row_at_tiny_sizes(size: tuple[int, int]) -> None:
    """At 40×12 the user detail showed no request at all: the header (2 lines), the
    summary (7), the table's frame (2) and the footer took every line, and the table
    got its frame only. Chrome gives way now — the table's frame, then the summary's
    last figures, which it counts ("+4 more figures") — so a request row is always
    there, with the header and the footer."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user("batch-job")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        await until(pilot, lambda: len(request_rows(screen_text(app).splitlines())) > 0
                    and "back" in screen_text(app).splitlines()[-1],
                    10, "a request row and the footer")
        lines = screen_text(app).splitlines()
        screen = app.screen
        assert isinstance(screen, UserDetail)
        table = screen.requests.region
    text = "\n".join(lines)
    assert "window 60 s" in lines[0], text
    assert "user batch-job" in lines[2], text
    assert "back" in lines[-1], text
    assert table.bottom <= size[1] - 1, text  # the table ends above the footer
    rows = request_rows(lines[table.y:table.bottom])
    assert rows, text
    summary = "\n".join(lines[3:table.y])
    labels = ("requests", "in flight", "output tok/s", "TTFT p95", "ITL p95",
              "SLO attainment")  # batch-job's figures
    shown = sum(1 for label in labels if re.search(rf"\b{label} +\S", summary))
    if shown < len(labels):  # what is left out is counted
        assert f"+{len(labels) - shown} more figures" in text, text
    else:
        assert "more figures" not in text, text


async def test_user_detail_keeps_its_frame_where_it_fits() -> None:
    """Where the framed table has room for rows, the frame and its title stay."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(40, 16)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user("batch-job")
        await until(pilot, lambda: "active requests of batch-job" in screen_text(app), 10,
                    "the framed table")
        await until(pilot, lambda: len(request_rows(screen_text(app).splitlines())) > 0,
                    10, "a request row")
        text = screen_text(app)
    assert "5 active" in text and "more figures" not in text, text
