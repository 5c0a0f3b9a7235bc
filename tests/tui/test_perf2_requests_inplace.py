"""Requests that start or end no longer clear the active requests' table and add every
row again (500 rows at nearly every refresh of a busy proxy): a row is a place, so the
rows there take their new cells, and rows are added or taken off at the end. What the
table shows must be what a table built from scratch on the same requests shows, and the
cursor must stay on its request."""

from __future__ import annotations

import math
import random
from typing import Any

from tui_support import FIXED_NOW, FixtureSource, until

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import request_key
from llmtop.tui.widgets.requests import RequestsTable, request_cells, request_widths

SIZE = (160, 48)


def request(i: int) -> dict[str, Any]:
    waiting = i % 4 == 0
    return {"id": f"r-{i:04d}", "user": f"user-{i % 7}", "model": "sim-8b",
            "state": "waiting" if waiting else "streaming", "age_s": 100.0 - i * 0.5,
            "ttft_s": None if waiting else 0.2 + (i % 5) / 10,
            "completion_tokens": 0 if waiting else 10 * i, "tps": None if waiting else 30.0}


def text(table: RequestsTable) -> list[str]:
    return [table.render_line(y).text for y in range(table.size.height)]


def cursor_id(table: RequestsTable) -> str | None:
    row = table.request_for(str(table.cursor_row))
    return None if row is None else request_key(row)[1]


async def from_scratch(requests: list[dict[str, Any]]) -> list[str]:
    source = FixtureSource("saturated")
    source.requests = requests
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.requests
        await until(pilot, lambda: table.row_count == len(requests), what="the requests")
        await pilot.pause()
        return text(table)


async def test_requests_that_start_and_end_are_written_in_place() -> None:
    source = FixtureSource("saturated")
    source.requests = [request(i) for i in range(40)]
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.requests
        await until(pilot, lambda: table.row_count == 40, what="40 requests")
        await pilot.press("tab", *["down"] * 5)
        await until(pilot, lambda: cursor_id(table) == "r-0005", what="the cursor on r-0005")
        before = dict(table.rows)
        # the 3 oldest end, 2 start; everyone's age moves on
        source.requests = [request(i) for i in range(3, 42)]
        for r in source.requests:
            r["age_s"] += 1.0
        assert await app.refresh_now()
        await until(pilot, lambda: table.row_count == 39, what="39 requests")
        await pilot.pause()
        now = dict(table.rows)
        assert all(now[k] is before[k] for k in now)  # the same rows, not added again
        assert cursor_id(table) == "r-0005" and table.cursor_row == 2
        shown = text(table)
        # fewer requests than rows: rows taken off the end
        source.requests = source.requests[:30]
        assert await app.refresh_now()
        await until(pilot, lambda: table.row_count == 30, what="30 requests")
        await pilot.pause()
        assert all(table.rows[k] is before[k] for k in table.rows)
        assert cursor_id(table) == "r-0005"
        fewer = text(table)
    assert shown == await from_scratch([request(i) | {"age_s": request(i)["age_s"] + 1.0}
                                        for i in range(3, 42)])
    assert fewer == await from_scratch([request(i) | {"age_s": request(i)["age_s"] + 1.0}
                                        for i in range(3, 33)])


def test_request_widths_are_the_cells_widths() -> None:
    """The columns' widths are worked out without making the cells; they must be the
    widths of the cells made."""
    rng = random.Random(46)
    strings = ["", "a", "batch-job", "日本語のユーザー名はとても長い", "\x1b[2Jevil\x07",
               "\u202eabc", "x" * 40, "sim-8b", "waiting", "streaming", "µ", None, 7]
    widths: dict[tuple[str, str], int] = {}
    pal = Palette()

    def number() -> Any:
        return rng.choice([None, 0, -1.5, math.nan, math.inf, 0.5004, 1e-7,
                           rng.random() * 10 ** rng.randint(-6, 9)])

    for _ in range(3000):
        r = {"id": rng.choice(strings), "user": rng.choice(strings),
             "model": rng.choice(strings), "state": rng.choice(strings),
             "age_s": number(), "ttft_s": number(), "tps": number(),
             rng.choice(["completion_tokens", "tokens"]): number()}
        slo = rng.choice([None, 0.5])
        cells = request_cells(r, pal, slo)
        assert request_widths(r, slo, widths) == {k: c.cell_len for k, c in cells.items()}, r


def test_labels_kept_are_fmt_names() -> None:
    table = RequestsTable()
    rng = random.Random(7)
    pool = ["svc-eu-west-1-worker-017", "svc-eu-west-1-worker-018", "alice", "", "bob",
            "svc-eu-west-1-worker-019-long-name"]
    for _ in range(300):
        names = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        width = rng.randint(1, 24)
        assert table._names(names, "user", width, "(empty)") == \
            fmt.names(names, width, "(empty)"), (names, width)


def stored(table: RequestsTable, row: int) -> list[str]:
    """Row ``row``'s cells as the table holds them, without making them (``get_row``
    would)."""
    return [c.plain for c in table._data[table._row_locations.get_key(row)].values()]


def drawn(table: RequestsTable, row: int) -> str:
    y = row - int(table.scroll_y) + 1  # (the header's line first)
    assert 1 <= y < table.size.height, (row, table.scroll_y)
    return table.render_line(y).text


async def test_a_request_row_out_of_view_is_made_when_scrolled_to() -> None:
    source = FixtureSource("saturated")
    source.requests = [request(i) for i in range(120)]
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.requests
        await until(pilot, lambda: table.row_count == 120, what="120 requests")
        await pilot.pause()
        assert table.size.height < 100
        assert all(t == "" for t in stored(table, 119))  # never drawn, never made
        table.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        line = drawn(table, 119)
        last = request(119)
        assert "r-0119" in line and fmt.latency(last["age_s"]) in line, line
        assert fmt.count(last["completion_tokens"]) in line, line
        table.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        source.requests[119]["completion_tokens"] = 876_543  # out of view
        source.requests[119]["age_s"] += 0.25
        assert await app.refresh_now()
        await pilot.pause()
        assert "876,543" not in stored(table, 119)  # not made while out of view
        table.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert "876,543" in drawn(table, 119), drawn(table, 119)
        assert fmt.latency(last["age_s"] + 0.25) in drawn(table, 119)
        # what get_row gives is made first, for a row out of view as well
        source.requests[0]["completion_tokens"] = 765_432
        assert await app.refresh_now()
        await pilot.pause()
        assert "765,432" in [c.plain for c in table.get_row_at(0)]
