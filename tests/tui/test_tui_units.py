"""The TUI's pure parts: value formatting, safe snapshot reading, colours and the chart."""

from __future__ import annotations

import math

import pytest

from llmtop.tui import fmt
from llmtop.tui.chart import BLOCKS, LINE, ChartStyle, render_chart, resample
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num, dicts
from llmtop.tui.widgets.requests import order_requests
from llmtop.tui.widgets.users import COLUMNS, sort_users, user_label


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "n/a"), (math.nan, "n/a"), (0.0, "0 ms"), (0.00085, "850 µs"), (0.00412, "4.12 ms"),
     (0.0123, "12.3 ms"), (0.5, "500 ms"), (1.234, "1.23 s"), (42.0, "42.0 s"), (754.0, "12m34s")],
)
def test_latency_formatting(seconds: float | None, shown: str) -> None:
    """Latencies take the most readable unit with three significant figures."""
    assert fmt.latency(seconds) == shown


def test_rates_counts_percentages_bytes_durations() -> None:
    """Rates, counts, percentages, sizes and durations format as on screen, None as n/a."""
    assert fmt.rate(1452.7) == "1,453"
    assert fmt.rate(62.44) == "62.4"
    assert fmt.rate(6.6) == "6.60"
    assert fmt.rate(None) == "n/a"
    assert fmt.count(86013) == "86,013"
    assert fmt.pct(0.982, fraction=True) == "98%"
    assert fmt.pct(0.081, fraction=True) == "8.1%"
    assert fmt.pct(math.inf) == "n/a"
    assert fmt.size_bytes(77.6 * 1024**3) == "77.6 GiB"
    assert fmt.size_bytes(512) == "512 B"
    assert fmt.duration(3725) == "1h02m"
    assert fmt.duration(-1) == "n/a"
    assert fmt.duration(200000) == "2d07h"
    assert [fmt.window(w) for w in (10, 60, 300, None)] == ["10 s", "60 s", "5 min", "all"]


def test_snapview_reads_wrong_types_as_none() -> None:
    """Missing keys, nulls, strings, booleans, NaN and non-dict levels all read as None."""
    v = SnapView({"system": {"rps": "fast", "in_flight": True, "errors": math.nan,
                             "waiting": 3}, "latency": [1, 2], "users": "nobody"})
    assert v.num("system", "rps") is None
    assert v.num("system", "in_flight") is None
    assert v.num("system", "errors") is None
    assert v.num("system", "waiting") == 3.0
    assert v.num("latency", "ttft", "p95") is None
    assert v.num("nothing", "at", "all") is None
    assert v.items("users") == []
    assert SnapView(None).time is None
    assert SnapView([1, 2]).raw == {}  # type: ignore[arg-type]
    assert as_num(7) == 7.0 and as_num(False) is None
    assert dicts([{"a": 1}, 3, None, "x"]) == [{"a": 1}]


def test_snapview_slo_uptime_and_recording() -> None:
    """SLOs, uptime (from uptime_s or started_at) and the recording state in every form."""
    v = SnapView({"time": 1000.0, "started_at": 400.0,
                  "slo": {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}})
    assert v.slo.for_metric("ttft") == 0.5
    assert v.slo.for_metric("itl") == 0.05
    assert v.slo.for_metric("chunk_gap") is None
    assert v.uptime_s == 600.0
    assert SnapView({"uptime_s": 5}).uptime_s == 5.0
    assert SnapView({"recording": None}).recording_path is None
    assert SnapView({"recording": {"status": "recording", "path": "a.jsonl"}}).recording_path \
        == "a.jsonl"
    assert SnapView({"recording": {"status": "stopped", "path": "a.jsonl"}}).recording_path \
        is None
    assert SnapView({"recording": {"active": False}}).recording_path is None
    assert SnapView({"recording": True}).recording_path == ""
    assert SnapView({"recording": "idle"}).recording_path is None


def test_palette_judges_against_targets() -> None:
    """Latency: ≤ 80% of SLO ok, up to SLO warn, over bad; attainment vs target; usage %."""
    p = Palette()
    assert p.latency(0.3, 0.5) == p.ok
    assert p.latency(0.45, 0.5) == p.warn
    assert p.latency(0.6, 0.5) == p.bad
    assert p.latency(0.6, None) == ""
    assert p.latency(None, 0.5) == p.dim
    assert p.attainment(0.97, 0.95) == p.ok
    assert p.attainment(0.90, 0.95) == p.warn
    assert p.attainment(0.41, 0.95) == p.bad
    assert p.usage(50) == p.ok and p.usage(85) == p.warn and p.usage(98) == p.bad
    themed = Palette.from_variables({"text-error": "#D17E92", "text-success": "auto 60%"})
    assert themed.bad == "#D17E92" and themed.ok == Palette().ok


def test_chart_draws_bars_newest_right_with_threshold_line() -> None:
    """Bars grow from the bottom, newest on the right; the threshold is a dashed line
    where bars do not reach it; bars over it take the 'over' style."""
    style = ChartStyle(bar="green", over="red", line="yellow")
    text = render_chart([1.0, 2.0, 4.0], width=5, height=2, threshold=3.0, style=style)
    rows = text.plain.split("\n")
    assert len(rows) == 2 and all(len(r) == 5 for r in rows)
    # top = max(4.0, threshold × 1.25 = 3.75) = 4.0: 16 eighths over two rows
    assert rows[1][:2] == "  "  # padding on the left: only three values
    assert rows[1][2:] == BLOCKS[4] + BLOCKS[8] + BLOCKS[8]
    assert rows[0][4] == BLOCKS[8]
    assert LINE in rows[0]  # line row: int(3 / 4 × 2) = 1 → the top row
    over = [s for s in text.spans if s.style == "red"]
    assert over and all(text.plain[s.start:s.end].strip(LINE) for s in over)


def test_chart_handles_gaps_zeros_and_empty() -> None:
    """None leaves a gap, a small positive value still shows, nothing to draw is blank."""
    text = render_chart([None, 0.0, 0.001, 10.0], width=4, height=1)
    assert text.plain == "  " + BLOCKS[1] + BLOCKS[8]
    assert render_chart([], width=3, height=2).plain == "   \n   "
    assert render_chart([1.0], width=0, height=3).plain == ""


def test_resample_keeps_spikes() -> None:
    """Downsampling keeps each bucket's maximum, so a one-sample spike survives."""
    values: list[float | None] = [1.0] * 100
    values[37] = 50.0
    out = resample(values, 10)
    assert len(out) == 10 and max(v for v in out if v is not None) == 50.0
    assert resample([None, None, 3.0, None], 2) == [None, 3.0]


def test_user_sorting_puts_missing_values_last() -> None:
    """Sorting by a column puts users without a value last, in either direction."""
    users = [{"user": "a", "ttft_p95": 0.2}, {"user": "b", "ttft_p95": None},
             {"user": "c", "ttft_p95": 0.9}]
    ttft = next(c for c in COLUMNS if c.key == "ttft_p95")
    assert [u["user"] for u in sort_users(users, ttft, reverse=True)] == ["c", "a", "b"]
    assert [u["user"] for u in sort_users(users, ttft, reverse=False)] == ["a", "c", "b"]
    assert user_label("") == "(empty)"
    assert len(user_label("x" * 100)) == 28


def test_active_requests_oldest_first() -> None:
    """Active requests are listed oldest first, unknown ages last."""
    rows = [{"id": "a", "age_s": 1.0}, {"id": "b"}, {"id": "c", "age_s": 9.0}]
    assert [r["id"] for r in order_requests(rows)] == ["c", "a", "b"]


@pytest.mark.parametrize(
    ("failing", "said", "style"),
    [(16, "now 48 in flight: over capacity", "red"),
     (None, "now 48 in flight: above every level measured so far", "yellow")],
)
def test_capacity_line_says_over_capacity_only_once_a_level_failed(
        failing: int | None, said: str, style: str) -> None:
    """Capacity ≈ 12 with 48 in flight is "over capacity" only when a higher level failed
    the target; without one, 12 is the highest level with data (a load ramp that has just
    reached 48), not a limit."""
    from llmtop.tui.widgets.capacity import CapacityLine

    line = CapacityLine()
    line.view = SnapView({"capacity": {"max_concurrency_at_slo": 12, "goodput_tps_at_slo": 1105.0,
                                       "first_failing_concurrency": failing},
                          "system": {"in_flight": 48}})
    text = line.build(160)
    assert text.plain.endswith(said), text.plain  # type: ignore[union-attr]
    assert any(str(span.style) == style and said in text.plain[span.start:span.end]  # type: ignore[union-attr]
               for span in text.spans)  # type: ignore[union-attr]


def test_capacity_line_below_a_failing_level_with_too_little_data_under_it() -> None:
    from llmtop.tui.widgets.capacity import CapacityLine

    line = CapacityLine()
    line.view = SnapView({"capacity": {"max_concurrency_at_slo": None,
                                       "first_failing_concurrency": 14,
                                       "min_requests_per_bin": 20},
                          "system": {"in_flight": 10}})
    text = line.build(160).plain  # type: ignore[union-attr]
    assert text.startswith("capacity max concurrency at SLO < 14"), text
    assert "collecting" not in text
