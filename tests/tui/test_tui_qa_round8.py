"""QA round 8, on screen: capacity "≈ 0, goodput ≈ 0 tok/s" when even concurrency 1 misses
the SLOs; two different figures both called "goodput" (the header's, for the window, and the
output chart's reference line, at capacity)."""

from __future__ import annotations

import re

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp

SIZES = [(160, 48), (120, 40), (80, 24)]


async def _screen(src: FixtureSource, size: tuple[int, int]) -> str:
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        return screen_text(app)


@pytest.mark.parametrize("size", SIZES)
async def test_capacity_none_is_said_as_bench_says_it(size: tuple[int, int]) -> None:
    src = FixtureSource("saturated")
    src.snapshot["capacity"] = {"max_concurrency_at_slo": 0, "goodput_tps_at_slo": 0.0,
                                "first_failing_concurrency": 1}
    text = await _screen(src, size)
    (line,) = [x for x in text.splitlines() if x.lstrip("│ ").startswith("capacity")]
    assert "none — even concurrency 1 misses the SLOs" in line, line
    assert "≈ 0" not in text and "goodput ≈" not in line, line
    assert "over capacity" not in line  # nothing to be over: no level meets the SLOs
    # no reference line at 0 on the charts either ("capacity 0", "goodput 0")
    assert not re.search(r"╌ [a-z ]*capacity 0\b", text), text


def test_capacity_none_above_concurrency_1_names_the_lowest_level_seen() -> None:
    from llmtop.tui.snapview import SnapView
    from llmtop.tui.widgets.capacity import CapacityLine

    line = CapacityLine()
    line.view = SnapView({"capacity": {"max_concurrency_at_slo": 0, "goodput_tps_at_slo": 0.0,
                                       "first_failing_concurrency": 4},
                          "system": {"in_flight": 6}})
    assert line.build(160).plain == (  # type: ignore[union-attr]
        "capacity max concurrency at SLO: none — even concurrency 4, the lowest seen, "
        "misses the SLOs")


@pytest.mark.parametrize("size", SIZES[:2])  # 80×24 has no room for the charts
async def test_only_the_window_goodput_is_called_plain_goodput(size: tuple[int, int]) -> None:
    """The header's "goodput 596" is the window's; the output chart's reference line (the
    goodput at capacity, 1,105) is labelled so the two cannot be taken for one figure."""
    text = await _screen(FixtureSource("saturated"), size)
    assert re.search(r"goodput 596", text), text  # the header's
    assert "╌ goodput 1,105" not in text, text
    assert re.search(r"output tok/s 1,4[0-9]{2}\s+╌ (goodput at )?capacity 1,(105|…)", text), text
