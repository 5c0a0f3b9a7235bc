"""Pilot tests: what does not fit the terminal is cut visibly ("…") or dropped whole, never
wrapped off the panel or cut mid-value."""

from __future__ import annotations

import re

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.fmt import latency
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.users import COLUMNS, cell

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


def users_lines(app: LlmtopApp) -> list[str]:
    """The users table's rows on screen (header first), cut to the table's region."""
    r = app.dashboard.users.region
    lines = screen_text(app).splitlines()
    return [ln[r.x:r.x + r.width] for ln in lines[r.y:r.y + r.height]]


@pytest.mark.parametrize("size", [(160, 48), (80, 24), (60, 20)])
async def test_users_columns_that_do_not_fit_are_dropped_whole(size: tuple[int, int]) -> None:
    """With a 40-character user name, at every width each header shown is whole, the
    sort column is among them, and every value in a row is the whole figure (no "19."
    for 19.3 ms, no "1.73" for 1.73 s): columns that do not fit are left out."""
    src = FixtureSource("saturated")
    src.snapshot["users"][1]["user"] = "carol-with-a-very-long-name-for-a-column"
    src.snapshot["users"][0]["itl_p95"] = 0.0193
    src.snapshot["users"][0]["ttft_p95"] = 1.73
    src.snapshot["users"][2]["output_tps"] = 26.5
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        # the three rows on screen, not only in the table: on a busy machine the screen
        # read after one pause still showed them blank
        await until(pilot, lambda: app.dashboard.users.row_count == 3
                    and all(ln.strip() for ln in users_lines(app)[1:4]),
                    what="the three users' rows on screen")
        await pilot.pause()
        table = app.dashboard.users
        header, *rows = users_lines(app)
    labels = re.split(r"\s{2,}", header.strip())
    by_label = {c.label: c for c in COLUMNS}
    shown = [by_label[label.removesuffix(" ▼").removesuffix(" ▲")] for label in labels]
    assert shown == table.shown_columns
    assert "out tok/s ▼" in labels
    if size[0] < 80:
        assert len(shown) < len(COLUMNS)
    view = SnapView(src.snapshot)
    for line, user in zip(rows, sorted(src.snapshot["users"],
                                       key=lambda u: -u["output_tps"]), strict=False):
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(shown), line
        assert user["user"].startswith(cells[0].removesuffix("…"))
        expected = [cell(c, user, view, Palette()).plain for c in shown[1:]]
        assert cells[1:] == expected


async def test_s_sorts_only_by_columns_on_screen() -> None:
    """At 60 columns `s` cycles through the columns shown: the sort arrow is always on
    screen, and a full round comes back to out tok/s."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        table = app.dashboard.users
        assert len(table.shown_columns) < len(COLUMNS)
        seen = []
        for _ in range(len(table.shown_columns)):
            await pilot.press("s")
            await pilot.pause()
            assert table.sort_column in table.shown_columns
            header = users_lines(app)[0]
            assert "▼" in header or "▲" in header, header
            seen.append(table.sort_column.key)
        assert seen[-1] == "output_tps"
        assert len(set(seen)) == len(seen)


@pytest.mark.parametrize(("size", "shown"), [((100, 40), "GeForce RTX 4…"),
                                             ((150, 40), "GeForce RTX 4090 ")])
async def test_long_gpu_name_is_ellipsised(size: tuple[int, int], shown: str) -> None:
    """A GPU name longer than its 14 columns (90–139 wide) ends in "…"; wider screens
    have room for it whole."""
    src = FixtureSource("saturated")
    src.snapshot["gpus"][0]["name"] = "NVIDIA GeForce RTX 4090"
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    assert f"0 SIM {shown}" in text


async def test_small_terminal_filter_leaves_the_users_rows() -> None:
    """At 60×20, typing a filter takes one line: the three matching users stay visible."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 3)
        await pilot.press("slash", "a")
        await until(pilot, lambda: app.dashboard.users.filter_text == "a")
        await pilot.pause()
        text = screen_text(app)
    for user in ("batch-job", "alice", "key:3f9a1c2e"):
        assert user in text, user


@pytest.mark.parametrize("width", [60, 64, 40])
async def test_engine_line_breaks_between_figures(width: int) -> None:
    """Where the engine's figures do not fit one line they move to the next whole: a
    label never ends a line without its value ("preempt" / "0")."""
    src = FixtureSource("saturated")
    src.snapshot["engine"].update(running=1, waiting=0, kv_cache_usage=0.016, preemptions=0)
    app = make_app(src)
    async with app.run_test(size=(width, 30)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    for label, value in (("running", "1"), ("waiting", "0"), ("KV", ""), ("preempt", "0")):
        assert re.search(rf"\b{label} \S*{value}", text), (label, text)


async def test_engine_bar_never_makes_the_layout_flip() -> None:
    """At 60×20 the engine line with its KV bar would be 61 cells: the bar is left out
    rather than pushing "preempt 0" to a third line, so the screen needs no scrollbar and
    the users table keeps the whole width and its SLO column whole (with the bar the
    screen's scrollbar came and went, and the table was drawn for the other width)."""
    src = FixtureSource("low_load")
    src.snapshot["users"][0]["user"] = "carol-with-a-very-long-user-name-that-overflows"
    src.snapshot["engine"].update(kind="sim", running=3, waiting=0, kv_cache_usage=0.033,
                                  preemptions=0)
    app = make_app(src)
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        for _ in range(3):
            await app.refresh_now()
            await pilot.wait_for_scheduled_animations()  # laid out and drawn for it
        line = "engine sim  running 3  waiting 0  KV 3.3%  preempt 0"
        await until(pilot, lambda: line in screen_text(app), what="the engine line whole")
        table = app.dashboard.users
        assert table.size.width == 60
        header = users_lines(app)[0]
        text = screen_text(app)
    assert "engine sim  running 3  waiting 0  KV 3.3%  preempt 0" in text
    assert header.rstrip().endswith("SLO"), header


async def test_user_detail_on_a_narrow_terminal_has_one_figure_a_line() -> None:
    """At 40 columns two label/value pairs a line do not fit: one a line, every value
    whole (no "5.…" for 5.20 s)."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=(40, 30)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user("batch-job")
        await pilot.pause()
        lines = screen_text(app).splitlines()
    summary = lines[3:9]
    assert not any("…" in ln for ln in summary), summary
    for label, value in (("requests", "240"), ("output tok/s", "881"),
                         ("TTFT p95", "5.20 s"), ("ITL p95", "72.0 ms"),
                         ("SLO attainment", "22%")):
        assert any(re.fullmatch(rf" {label} +{re.escape(value)} *", ln) for ln in summary), label


@pytest.mark.parametrize("width", [36, 40, 48, 56, 64, 100])
async def test_latency_table_drops_percentiles_rather_than_cutting_values(width: int) -> None:
    """QA at 40 columns: every latency read "2.9…", "41.…" — numbers that look whole but
    are not. Now whole percentile columns give way (p90 first), the values left are whole,
    and p99 is always there."""
    src = FixtureSource("saturated")
    app = make_app(src)
    async with app.run_test(size=(width, 40)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        text = screen_text(app)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if re.search(r"\blatency\b.*\bp99\b", line))
    header = lines[head].split()
    rows = {line.split()[0]: line for line in lines[head + 2:head + 7]}
    assert set(rows) == {"TTFT", "ITL", "chunk", "TPOT", "E2E"}, lines[head:head + 7]
    shown = [p for p in ("p50", "p90", "p95", "p99", "max") if p in header]
    assert "p99" in shown
    if width >= 64:
        assert shown == ["p50", "p90", "p95", "p99", "max"]
    else:
        assert "p90" not in shown
    ttft = src.snapshot["latency"]["ttft"]
    for p in shown:  # the TTFT row has every shown figure whole
        assert latency(ttft[p]) in rows["TTFT"]
    assert "…" not in "".join(rows.values())
