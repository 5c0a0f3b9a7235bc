"""The plots' titles keep their figures whole: the words give way first."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.widgets.plots import PLOTS, title_parts


@pytest.mark.parametrize("size", [(160, 48), (200, 50), (250, 70)])
async def test_capacity_figure_is_whole_in_the_output_chart_title(
        size: tuple[int, int]) -> None:
    """QA #10: at 160 columns the output chart's title read "╌ capacity 23,…": the
    reference figure is whole now (the title says "out tok/s" rather than cut it)."""
    src = FixtureSource("saturated")
    src.snapshot["capacity"].update(max_concurrency_at_slo=96, goodput_tps_at_slo=23456.0)
    for point in src.snapshot["series"]:
        point.update(output_tps=12345.6, in_flight=128)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    assert re.search(r"out(put)? tok/s 12,346  ╌ [a-z ]*23,456", text), text
    assert "╌ capacity 96" in text, text
    assert "23,…" not in text


@pytest.mark.parametrize(("width", "expected"), [
    (60, ("output tok/s", "  ╌ goodput at capacity 23,456")),
    (36, ("out tok/s", "  ╌ capacity 23,456")),
    (30, ("out tok/s", "  ╌ 23,456")),
    (25, ("out tok/s", " ╌ 23,456")),
])
def test_title_parts_drop_words_before_figures(width: int, expected: tuple[str, str]) -> None:
    spec = next(p for p in PLOTS if p.key == "output_tps")
    assert title_parts(spec, "12,346", "23,456", width) == expected


async def test_a_latency_figure_from_an_earlier_interval_says_how_old_it_is() -> None:
    """With no request finished in the latest intervals, the TTFT chart's title showed
    the last figure there was as if it were the latest ("figures: latest 2s"), for as long
    as the series held it; it now says its age. Output tok/s has a figure (0) each
    interval, so it has none."""
    src = FixtureSource("saturated")
    series = src.snapshot["series"]
    ts = [p["t"] for p in series]
    step = min(b - a for a, b in pairwise(ts) if b > a)
    for point in series[-3:]:
        point["ttft_p95"] = None
    series[-4]["ttft_p95"] = 4.21
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    assert f"TTFT p95 4.21 s ({int(3 * step)}s ago)" in text, text
    assert not re.search(r"output tok/s [0-9,.]+ \(", text), text
