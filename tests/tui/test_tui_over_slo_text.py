"""A latency just over its SLO was written rounded to the SLO itself: a TTFT p95 of
500.4 ms against an SLO of 500 ms read "500 ms", in the colour of a miss, beside "500 ms"
in the SLO column (the users' table, the requests' TTFT and the engine line alike). A value
over its limit that rounds to it now reads ">500 ms"; one at or under it is unchanged."""

from __future__ import annotations

from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp


def test_a_value_over_its_limit_never_reads_as_the_limit() -> None:
    assert fmt.latency_against(0.5004, 0.5) == ">500 ms"
    assert fmt.latency_against(0.05004, 0.05) == ">50.0 ms"
    assert fmt.latency_against(0.5, 0.5) == "500 ms"  # at the limit: met
    assert fmt.latency_against(0.4996, 0.5) == "500 ms"  # under it, rounded up: met
    assert fmt.latency_against(0.5104, 0.5) == "510 ms"  # over, and reads so already
    assert fmt.latency_against(0.5004, None) == "500 ms"
    assert fmt.latency_against(None, 0.5) == fmt.NA


async def test_the_screen_marks_values_just_over_the_slo() -> None:
    src = FixtureSource("saturated")
    snap = src.snapshot
    assert snap["slo"]["ttft_s"] == 0.5 and snap["slo"]["itl_p95_s"] == 0.05
    snap["latency"]["ttft"].update(p50=0.3, p90=0.45, p95=0.5004, p99=0.5004, max=0.5004)
    snap["users"][0].update(ttft_p95=0.5003, itl_p95=0.05002)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    ttft_row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("TTFT")
                    and "p95" not in line)
    assert ttft_row.count(">500 ms") == 3, ttft_row  # p95, p99, max; p90 450 ms is not
    assert "450 ms" in ttft_row and ">450" not in ttft_row
    assert ">50.0 ms" in text  # the user's ITL p95
