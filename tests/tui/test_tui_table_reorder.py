"""A re-sort (s, S) and a refresh that only moves a few users keep the users table's rows
and move them, instead of clearing the table and adding every row again.

With 3,000 users each ``s`` took 1-3 s and a refresh 0.5-3 s: the table was rebuilt,
and Textual's DataTable measured every cell of every row added (the columns' widths are
the table's own: the measurements changed nothing). The rows are now moved in place
(the headings relabelled, the changed cells written, the rows sorted); what the table
shows must be exactly what a table built from scratch on the same data shows."""

from __future__ import annotations

from typing import Any

from tui_support import FIXED_NOW, FixtureSource, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.widgets.users import UsersTable

SIZE = (160, 48)


def table_text(table: UsersTable) -> list[str]:
    """The table's lines as it draws them now (headings included), as plain text."""
    return [table.render_line(y).text for y in range(table.size.height)]


def rows(table: UsersTable) -> dict[object, object]:
    """Row key → the table's Row object (a table cleared and refilled has new ones)."""
    return dict(table.rows)


async def from_scratch(snapshot: dict[str, Any], sort: tuple[int, bool]) -> list[str]:
    """The users table of a new app shown ``snapshot`` sorted by ``sort`` (column index,
    reversed) at its first data: built by clearing and adding every row."""
    source = FixtureSource("many_users")
    source.snapshot = snapshot
    source.down = True  # no data until the sort is set
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: app.error is not None, what="the first fetch failed")
        table.sort_index, table.sort_reverse = sort
        source.down = False
        assert await app.refresh_now()
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        await pilot.pause()
        return table_text(table)


async def test_s_and_S_move_the_rows_and_show_what_a_new_table_shows() -> None:
    source = FixtureSource("many_users")
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    shown: list[tuple[tuple[int, bool], list[str]]] = []
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        before = rows(table)
        for key in ["s", "s", "S", "s", "s", "s", "s"]:
            sorted_by = (table.sort_index, table.sort_reverse)
            await pilot.press(key)
            await pilot.pause()
            assert (table.sort_index, table.sort_reverse) != sorted_by, key
            now = rows(table)
            assert now.keys() == before.keys()
            # the same Row objects: moved, not cleared and added again
            assert all(now[k] is before[k] for k in now), (key, table.sort_column.key)
            shown.append(((table.sort_index, table.sort_reverse), table_text(table)))
    snapshot = source.snapshot
    for sort, text in shown:
        assert text == await from_scratch(snapshot, sort), sort


async def test_a_refresh_that_moves_a_few_users_moves_their_rows() -> None:
    source = FixtureSource("many_users")
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        sort = (table.sort_index, table.sort_reverse)
        first = table_text(table)
        before = rows(table)
        users = source.snapshot["users"]
        tracked = [u for u in users if u.get("tracked") is not False]
        # the second busiest and the idlest user trade their rates (sorted by out
        # tok/s; the cursor stays on the first row, the busiest user's)
        by_rate = sorted(tracked, key=lambda u: u["output_tps"] or 0.0, reverse=True)
        two, low = by_rate[1], by_rate[-1]
        assert two["output_tps"] != low["output_tps"] != by_rate[0]["output_tps"]
        two["output_tps"], low["output_tps"] = low["output_tps"], two["output_tps"]
        assert await app.refresh_now()
        await pilot.pause()
        now = rows(table)
        assert all(now[k] is before[k] for k in now)
        assert table.cursor_row == 0 and table.scroll_y == 0
        text = table_text(table)
    assert text != first
    assert text == await from_scratch(source.snapshot, sort)


async def test_a_refresh_that_changes_a_few_figures_writes_those_cells() -> None:
    source = FixtureSource("many_users")
    app = LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=SIZE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        await pilot.pause()
        sort = (table.sort_index, table.sort_reverse)
        first = table_text(table)
        before = rows(table)
        # the first rows' request counts (not the sorted column): the order stays
        top = {table.user_for(row.key) for row in table.ordered_rows[:3]}
        for u in source.snapshot["users"]:
            if u["user"] in top:
                u["requests"] = 987_654
        assert await app.refresh_now()
        await pilot.pause()
        now = rows(table)
        assert all(now[k] is before[k] for k in now)
        text = table_text(table)
    assert text != first
    assert sum("987,654" in line for line in text) == 3
    assert text == await from_scratch(source.snapshot, sort)
