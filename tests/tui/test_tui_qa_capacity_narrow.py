"""QA: the capacity line keeps its verdict ("over capacity") below 80 columns.

At 80 columns the line is worded shorter so that the in-flight verdict still shows
(test_tui_fit); narrower, that shorter line was cut at its end: "capacity ≈ 12 at SLO ·
goodput ≈ 1,105 tok/s · 48 in fl…" at 60 columns, "capacity ≈ 12 at SLO · goodput ≈ 1,…"
at 40 — 48 requests in flight against a capacity of 12, without the word that says it
is too many. The goodput at capacity gives way first, then the wording shrinks again."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp


@pytest.mark.parametrize(("size", "said"), [
    ((80, 30), "capacity ≈ 12 at SLO · goodput ≈ 1,105 tok/s · 48 in flight: over capacity"),
    ((60, 30), "capacity ≈ 12 at SLO · 48 in flight: over capacity"),
    ((40, 30), "capacity ≈ 12 · now 48: over capacity"),
])
async def test_the_verdict_stays_at_narrow_widths(size: tuple[int, int], said: str) -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        line = next(ln for ln in screen_text(app).splitlines() if "capacity" in ln)
        assert said in line, line


async def test_above_the_levels_measured_stays_at_60_columns() -> None:
    """No level above 12 has failed yet: not "over", but above what was measured."""
    src = FixtureSource("saturated")
    src.snapshot["capacity"]["first_failing_concurrency"] = None
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(60, 30)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        line = next(ln for ln in screen_text(app).splitlines() if "capacity" in ln)
        assert "capacity ≈ 12 · now 48: above the levels measured" in line, line
