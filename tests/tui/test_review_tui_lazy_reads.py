"""Review of the tables that make a row's cells only when it is drawn or read
(``FixedWidthTable.fill_row``): DataTable's own ``get_column`` and ``sort`` read the
table's data without ``get_row``/``get_cell``, so for a row never drawn they read the
empty cells it was added with, not its figures. Driven through the real app, fed by a
real admin API over a socket."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable
from tui_support import FIXED_NOW, AdminServer, until_fetched

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource
from llmtop.tui.widgets.requests import order_requests

SIZE = (160, 30)


def plain(cells: Any) -> list[str]:
    return [c.plain for c in cells]


async def test_get_column_reads_every_rows_figures_drawn_or_not() -> None:
    srv = AdminServer("many_users")
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=SIZE) as pilot:
            users, requests = app.dashboard.users, app.dashboard.requests
            await until_fetched(pilot, lambda: users.row_count == 150
                                and requests.row_count == 60, what="the rows")
            await pilot.pause()
            # most rows are out of view: never drawn
            assert users.size.height < 100 and requests.size.height < 50
            by_user = {u["user"]: u for u in srv.snapshot["users"]}
            want = [fmt.count(by_user[str(users.user_for(
                users.coordinate_to_cell_key((i, 0)).row_key))]["requests"])
                for i in range(users.row_count)]
            assert plain(users.get_column("requests")) == want
            assert plain(users.get_column_at(users.get_column_index("requests"))) == want
            ages = [fmt.latency(r["age_s"]) for r in order_requests(srv.requests)]
            assert plain(requests.get_column("age")) == ages
    finally:
        await srv.stop()


async def test_sort_sorts_by_what_every_row_shows() -> None:
    srv = AdminServer("many_users")
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=SIZE) as pilot:
            requests = app.dashboard.requests
            await until_fetched(pilot, lambda: requests.row_count == 60, what="the rows")
            await pilot.pause()
            table: DataTable[Any] = requests
            table.sort("id", key=lambda c: c.plain)
            ids = sorted(str(r["id"]) for r in srv.requests)
            assert [table.get_row_at(i)[0].plain for i in range(table.row_count)] == ids
    finally:
        await srv.stop()
