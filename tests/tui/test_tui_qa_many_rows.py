"""QA: thousands of users or active requests, refreshed 4 times a second.

Every refresh that changed a figure (a live proxy's: all of them) cleared both tables and
added every row again, and the table measured every cell anew: with 2,000 users and as
many requests a refresh took over half a second here, and keys waited behind it. The same
rows in the same order now have only their changed cells written, in place."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable
from tui_support import FIXED_NOW, AdminServer, screen_text, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource


def rows_of(table: DataTable[Any]) -> dict[object, object]:
    return dict(table.rows)


async def test_a_figures_only_refresh_writes_cells_in_place() -> None:
    srv = AdminServer("many_users")
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(200, 60)) as pilot:
            users, requests = app.dashboard.users, app.dashboard.requests
            await until(pilot, lambda: users.row_count > 100 and requests.row_count > 50,
                        what="the rows")
            await pilot.pause()
            before = rows_of(users), rows_of(requests)
            top = users.user_for(users.coordinate_to_cell_key((0, 0)).row_key)
            for u in srv.snapshot["users"]:  # the order (output tok/s) stays
                u["requests"] = 4321 if u.get("user") == top else u.get("requests")
            for r in srv.requests:  # every request a second older: the order stays
                r["age_s"] = r["age_s"] + 1.0
            assert await app.refresh_now()
            await until(pilot, lambda: "4,321" in screen_text(app), what="the new figure")
            after = rows_of(users), rows_of(requests)
            assert [len(x) for x in after] == [len(x) for x in before]
            for old, new in zip(before, after, strict=True):
                assert all(new[k] is row for k, row in old.items())  # not added again
            # an order that changes still rebuilds the rows
            srv.requests.reverse()
            for i, r in enumerate(srv.requests):
                r["age_s"] = float(i)
            assert await app.refresh_now()
            await pilot.pause()
            first = requests.request_for("0")
            assert first is not None and first["age_s"] == float(len(srv.requests) - 1)
    finally:
        await srv.stop()
