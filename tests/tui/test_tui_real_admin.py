"""The TUI against llmtop's own admin API (real aggregator, recorder and routes on a
socket): what the proxy really answers, not a fixture of it."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest
from tui_support import FIXED_NOW, RealAdmin, prompt_open, screen_text, shows, until

from llmtop.events import ActiveRequest, EngineReading
from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource
from llmtop.tui.widgets.users import FOLD_KEY

WIDE = (160, 48)


async def test_r_enter_records_to_the_proposed_file(
    admin: RealAdmin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`r` then enter with the proposed name: the proxy accepts it (no error notified),
    ● REC shows it, and after `r` again the file in the proxy's working directory is a
    gzipped recording with its header."""
    monkeypatch.chdir(tmp_path)
    admin.request(1, "alice")
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "alice")
        await pilot.press("r")
        await prompt_open(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: bool(app._notifications), what="a notification")
        notes = [(n.message, n.severity) for n in app._notifications]
        assert all(sev != "error" for _, sev in notes), notes
        await shows(pilot, "● REC llmtop-")
        await pilot.press("r")
        await until(pilot, lambda: "● REC" not in screen_text(app), what="REC gone")
    assert recording_header(tmp_path)["type"] == "header"


async def test_engine_reading_older_than_a_few_scrapes_is_marked_stale(
    admin: RealAdmin,
) -> None:
    """The engine's last scrape 1 s ago is shown as is; once it is 21 s old (the engine
    died) the panel says "stale 21s" next to the last figures."""
    admin.request(1, "alice")
    admin.bus.publish(EngineReading(t=admin.now - 1, kind="vllm", running=16, waiting=3,
                                    kv_cache_usage=0.5, preemptions=0))
    admin.bus.drain()
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "running 16")
        assert "stale" not in screen_text(app)
        admin.now += 20
        await shows(pilot, "engine vllm  stale 21s  running 16")


def recording_header(directory: Path) -> dict[str, object]:
    """The first line of the one ``llmtop-*.jsonl.gz`` in ``directory``."""
    files = list(directory.glob("llmtop-*.jsonl.gz"))
    assert len(files) == 1, files
    with gzip.open(files[0], "rt") as f:
        header: dict[str, object] = json.loads(f.readline())
    return header


async def test_one_user_is_one_user(admin: RealAdmin) -> None:
    """The users box says "1 user" (not "1 users"), and "of 1 user" when filtering."""
    admin.request(1, "solo")
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "solo")
        assert str(app.dashboard.users_box.border_subtitle) == "1 user"
        await pilot.press("slash", "x")
        await until(pilot, lambda: str(app.dashboard.users_box.border_subtitle)
                    == "0 of 1 user · filter: x", what="filtered subtitle")


async def test_users_past_the_top_20_are_one_row_named_as_such(admin: RealAdmin) -> None:
    """34 users against the proxy's default top 20: the box says "top 20 users + ≈14 others"
    (not "21 users"), the folded row reads "(others)" and stays last whatever the sort,
    and its detail says what it is and lists the folded users' requests."""
    for i in range(34):
        admin.request(i, f"u{i:02d}", tokens=10 + i)
    start = time.perf_counter_ns() - 2 * 10**9
    for rid, user in (("live-tracked", "u01"), ("live-folded", "u25")):
        admin.active[rid] = ActiveRequest(rid, user, "m", "openai", "/v1/chat/completions",
                                          True, admin.now - 2, start)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 21, what="21 rows")
        # and how many users the fold holds, recently active (the proxy's estimate)
        assert str(app.dashboard.users_box.border_subtitle) == "top 20 users + ≈14 others"
        names = [table.user_for(table.coordinate_to_cell_key((i, 0)).row_key)
                 for i in range(table.row_count)]
        assert names[-1] == FOLD_KEY and "other" not in names[:-1]
        assert table.get_cell_at((20, 0)).plain == "(others)"
        await pilot.press("S")  # reversed: the folded row is still last
        await until(pilot, lambda: table.get_cell_at((0, 0)).plain == "u00", what="u00 first")
        assert table.get_cell_at((20, 0)).plain == "(others)"
        table.move_cursor(row=20)
        await pilot.press("enter")
        await shows(pilot, "every user past the top 20, in one row")
        text = screen_text(app)
        assert "active requests of (others)" in text
        assert "live-folded" in text and "live-tracked" not in text


async def test_user_detail_shows_counts_as_integers_with_labels(admin: RealAdmin) -> None:
    """The detail of a user, from the proxy's real row: counts are integers and every
    field has a label in words (no "slo_met 1.00", no "output_tokens 32.0")."""
    admin.request(1, "solo", tokens=32)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=10, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await shows(pilot, "solo")
        await pilot.press("enter")
        await shows(pilot, "user solo")
        text = screen_text(app)
    assert "_" not in text.split("active requests of solo")[0]
    lines = text.splitlines()
    for label, value in (("output tokens", "32"), ("met every SLO", "1"),
                         ("judged on SLOs", "1"), ("streaming", "0"), ("timeouts", "0")):
        assert any(re.search(rf"{label} +{value}( |$)", ln) for ln in lines), label
