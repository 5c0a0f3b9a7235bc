"""Pilot tests: what does not fit the terminal is cut visibly ("…") or dropped whole, never
wrapped off the panel or cut mid-value."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp

QUEUEING = ("saturated: 16 in flight, 14 of them only waiting (queue never empty for 2.5 s); "
            "output 67 tok/s; TTFT p95 1.56 s→5.09 s; consider more replicas/routing or a "
            "concurrency limit")
SLO_TTFT = ("TTFT SLO ≤ 500 ms met by 14% of the last 14 answered requests (target 95%); "
            "requests wait or prefill too long: fewer concurrent requests, more replicas, "
            "shorter prompts")


def make_app(source: FixtureSource) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)


def long_warnings(src: FixtureSource, *, kv: bool = False) -> None:
    now = src.snapshot["time"]
    src.snapshot["warnings"] = [
        {"code": "QUEUEING", "severity": "warning", "since": now - 16, "message": QUEUEING},
        {"code": "SLO_TTFT", "severity": "warning", "since": now - 14, "message": SLO_TTFT},
    ]
    if kv:
        src.snapshot["warnings"].append(
            {"code": "KV_CACHE", "severity": "critical", "since": now - 5,
             "message": "KV cache 97% full"})


@pytest.mark.parametrize("size", [(150, 40), (100, 40), (80, 24)])
async def test_each_warning_takes_one_ellipsised_line(size: tuple[int, int]) -> None:
    """Two warnings longer than the terminal: one line each, cut with "…", both codes
    shown, and the capacity line still right below them."""
    src = FixtureSource("saturated")
    long_warnings(src)
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        lines = screen_text(app).splitlines()
    assert "▲ QUEUEING 16s  saturated:" in lines[2]
    assert lines[2].rstrip().endswith("…")
    assert "▲ SLO_TTFT 14s  TTFT SLO ≤ 500 ms" in lines[3]
    assert lines[3].rstrip().endswith("…")
    assert lines[4].lstrip().startswith("capacity")


async def test_more_warnings_than_lines_name_the_rest() -> None:
    """At 80×24 the bar has two lines: three warnings show the worst one in full and
    name the other two codes on the second line."""
    src = FixtureSource("saturated")
    long_warnings(src, kv=True)
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        lines = screen_text(app).splitlines()
    assert "✖ KV_CACHE 5s  KV cache 97% full" in lines[2]
    assert "▲ +2 more: QUEUEING, SLO_TTFT" in lines[3]
    assert lines[4].lstrip().startswith("capacity")


async def test_capacity_verdict_fits_80_columns() -> None:
    """At 80 columns the capacity line is worded shorter so "over capacity" still shows."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    line = next(ln for ln in text.splitlines() if "capacity" in ln)
    assert "≈ 12 at SLO · goodput ≈ 1,105 tok/s · 48 in flight: over capacity" in line
