"""The users table makes cells only for the rows drawn (or read): with 3,000 users whose
figures all move, a refresh made every user's cells for the 40 rows shown. A row out of
view keeps whatever it had until it is drawn; these tests check that what is drawn is
always the latest, and that the columns' widths (worked out from every user's figures,
without making their cells) are exactly those every cell would give."""

from __future__ import annotations

import math
import random
from typing import Any

from rich.text import Text
from tui_support import FIXED_NOW, FixtureSource, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.users import (
    COLUMNS,
    KIND_WIDTH,
    UsersTable,
    cell,
    cell_text,
    header_label,
    text_width,
    widest_figure,
)

SIZE = (160, 30)


def line_of(table: UsersTable, row: int) -> str:
    """The text of ``row`` as drawn now (it must be in view)."""
    y = row - int(table.scroll_y) + 1  # (the header's line first)
    assert 1 <= y < table.size.height, (row, table.scroll_y)
    return table.render_line(y).text


def expected(table: UsersTable, app: LlmtopApp, row: int) -> list[str]:
    """What ``row``'s figure cells should read: made from the snapshot the app shows,
    for that row's user, with :func:`cell` (not from the table)."""
    key = table.coordinate_to_cell_key((row, 0)).row_key
    user = table.user_for(key)
    (u,) = [x for x in app.view.items("users") if x.get("user") == user]
    return [cell(c, u, app.view, table.palette).plain for c in table.shown_columns[1:]]


def stored(table: UsersTable, row: int) -> list[str]:
    """The row's cells as the table holds them, without making them (the private data:
    ``get_row`` would make them)."""
    key = table._row_locations.get_key(row)
    return [c.plain for c in table._data[key].values()]


def reads(line: str, texts: list[str]) -> bool:
    """Whether ``texts`` appear in ``line`` in that order."""
    at = 0
    for t in texts:
        at = line.find(t, at)
        if at < 0:
            return False
        at += len(t)
    return True


async def test_a_row_never_drawn_shows_its_figures_when_scrolled_to() -> None:
    app = LlmtopApp(FixtureSource("many_users"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        await pilot.pause()
        last = table.row_count - 1
        # never drawn, never made: its cells are empty
        assert all(t == "" for t in stored(table, last)), stored(table, last)
        table.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert int(table.scroll_y) > 0
        for row in range(int(table.scroll_y), last + 1):
            want = expected(table, app, row)
            assert want and any(w != "n/a" for w in want)
            assert reads(line_of(table, row), want), (row, line_of(table, row), want)
        # what get_row gives (the tests' and DataTable's own way of reading a row) is
        # made first, for a row out of view as well
        table.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        assert [c.plain for c in table.get_row_at(last)[1:]] == expected(table, app, last)


async def test_figures_changed_out_of_view_are_shown_when_scrolled_to() -> None:
    source = FixtureSource("many_users")
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        last = table.row_count - 1
        table.scroll_end(animate=False, immediate=True)  # the last row drawn once
        await pilot.pause()
        line = line_of(table, last)
        table.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        user = table.user_for(table.coordinate_to_cell_key((last, 0)).row_key)
        (u,) = [x for x in source.snapshot["users"] if x["user"] == user]
        assert u["requests"] != 987_654 and u["in_flight"] != 77
        u["requests"], u["in_flight"] = 987_654, 77  # not the sort column: it stays last
        assert await app.refresh_now()
        await pilot.pause()
        assert table.row_count == 150
        assert table.user_for(table.coordinate_to_cell_key((last, 0)).row_key) == user
        assert "987,654" not in " ".join(stored(table, last))  # not made while out of view
        table.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        now = line_of(table, last)
        assert now != line
        assert "987,654" in now and reads(now, expected(table, app, last)), now


def tied_snapshot(source: FixtureSource) -> None:
    """Every tracked user's out tok/s one of three values: most rows tie."""
    for i, u in enumerate(source.snapshot["users"]):
        if u.get("tracked") is not False:
            u["output_tps"] = (10.0, 20.0, None)[i % 3]


def names_shown(table: UsersTable) -> list[str | None]:
    return [table.user_for(table.coordinate_to_cell_key((i, 0)).row_key)
            for i in range(table.row_count)]


def sorted_names(app: LlmtopApp, reverse: bool) -> list[str]:
    """The users by out tok/s (``reverse``: largest first), ties by name, those without
    one last; then the fold."""
    users = [u for u in app.view.items("users") if u.get("tracked") is not False]
    have = [u for u in users if u["output_tps"] is not None]
    have.sort(key=lambda u: u["user"])
    have.sort(key=lambda u: u["output_tps"], reverse=reverse)
    missing = sorted((u for u in users if u["output_tps"] is None), key=lambda u: u["user"])
    return [u["user"] for u in have + missing]


async def test_ties_keep_name_order_through_resorts_and_refreshes() -> None:
    source = FixtureSource("many_users")
    tied_snapshot(source)
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        assert table.sort_column.key == "output_tps" and table.sort_reverse
        shown = [n for n in names_shown(table) if n is not None]
        assert shown[:len(sorted_names(app, True))] == sorted_names(app, True)
        await pilot.press("S")  # ascending: the ties still by name
        await pilot.pause()
        assert not table.sort_reverse
        assert names_shown(table)[:len(sorted_names(app, False))] == sorted_names(app, False)
        # figures move but ties stay ties: a refresh keeps that order
        for u in source.snapshot["users"]:
            if u.get("tracked") is not False:
                u["requests"] += 1
        assert await app.refresh_now()
        await pilot.pause()
        assert names_shown(table)[:len(sorted_names(app, False))] == sorted_names(app, False)
        for row in range(int(table.scroll_y), int(table.scroll_y) + table.size.height - 1):
            assert reads(line_of(table, row), expected(table, app, row))


def test_widest_figure_is_the_widest_cell_where_it_matters() -> None:
    """``widest_figure`` reads only the figures that might be wider than the heading
    allows; it must give what formatting every cell gives (less only where both are no
    wider than the column's room)."""
    rng = random.Random(46)
    view = SnapView({"slo": {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}})
    slo = view.slo
    palette = Palette()

    def value() -> Any:
        pick = rng.random()
        if pick < 0.05:
            return None
        if pick < 0.08:
            return rng.choice([math.inf, -math.inf, math.nan, "x"])
        if pick < 0.25:  # just over an SLO: the ">" case
            return rng.choice([0.5, 0.05, 0.95]) * (1 + rng.random() * 1e-3)
        if pick < 0.35:
            return -rng.random() * 10 ** rng.randint(0, 9)
        return rng.random() * 10 ** rng.randint(-7, 9)

    for _ in range(3000):
        users: list[dict[str, Any]] = [
            {"user": f"u{i}", **{c.key: value() for c in COLUMNS[1:]},
             "approximate": rng.random() < 0.3}
            for i in range(rng.randint(0, 6))]
        for column in COLUMNS[1:]:
            for sorted_by in (False, True):
                base = max(len(header_label(column, sorted_by, True)),
                           KIND_WIDTH[column.kind])
                every = max((text_width(cell_text(column, u, slo)) for u in users),
                            default=0)
                assert max(base, widest_figure(column, users, slo, base)) == \
                    max(base, every), (column.key, users)
                # and cell_text is what the cell shows
                for u in users:
                    made = cell(column, u, view, palette)
                    assert isinstance(made, Text)
                    assert made.plain == cell_text(column, u, slo)
                    assert made.cell_len == text_width(made.plain)
