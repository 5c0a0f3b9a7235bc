"""The latency table fits every column it shows, the sample count and SLO ones too: a
value is shown whole or its column left out, never cut."""

from __future__ import annotations

import re

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.widgets.latency import METRICS, fitting_columns, latency_text


def table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if re.search(r"\blatency\b.*\bp99\b", line))
    return lines[head:head + 2 + len(METRICS)]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
@pytest.mark.parametrize(("count", "value"), [(86_400_000, 0.0123), (86_400_000, 125.0),
                                              (1_234_567, 600.0)])
async def test_big_sample_counts_cut_no_value(size: tuple[int, int], count: int,
                                              value: float) -> None:
    """QA #7: with n ≥ 10 million the table was wider than the panel (the fitting
    ignored the n and SLO columns) and cut "12.3 …" and "50.0 …". Every value shown is
    whole; the count is shown whole where shown."""
    src = FixtureSource("saturated")
    for row in src.snapshot["latency"].values():
        row.update(count=count, p50=value, p90=value, p95=value, p99=value, max=value)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        lines = table_lines(screen_text(app))
    assert not any("…" in line for line in lines), "\n".join(lines)
    assert "p99" in lines[0]
    if " n " in lines[0] or lines[0].rstrip(" │").endswith(" n"):
        assert f"{count:,}" in lines[2], "\n".join(lines)


def test_fitting_columns_counts_the_n_and_slo_columns() -> None:
    """The widths of n and SLO count: at 78 cells, 86,400,000 leaves no room for all five
    percentiles and both extra columns; the SLO column (its colours say it) goes first."""
    values = {(key, p): "12.3 ms" for key, _ in METRICS for p in ("p50", "p90", "p95", "p99",
                                                                 "max")}
    for key, _ in METRICS:
        values[key, "n"] = "9,500"
        values[key, "SLO"] = "50.0 ms"
    assert fitting_columns(values, 78) == ["p50", "p90", "p95", "p99", "max", "n", "SLO"]
    for key, _ in METRICS:
        values[key, "n"] = "86,400,000"
    assert fitting_columns(values, 78) == ["p50", "p90", "p95", "p99", "max", "n"]
    assert fitting_columns(values, 60) == ["p50", "p95", "p99", "n"]
    assert fitting_columns(values, 50) == ["p50", "p95", "p99"]
    assert fitting_columns(values, 10) == ["p99"]


@pytest.mark.parametrize(("seconds", "text"), [
    (0.009996, "10.0 ms"), (0.0099, "9.90 ms"), (0.09996, "100 ms"), (0.9996, "1.00 s"),
    (9.996, "10.0 s"), (0.0009996, "1.00 ms"), (0.0123, "12.3 ms"), (None, "n/a"),
])
def test_latency_text_picks_the_unit_after_rounding(seconds: float | None, text: str) -> None:
    """Cosmetic: 9.996 ms read "10.00 ms" among "10.0 ms" style values."""
    assert latency_text(seconds) == text
