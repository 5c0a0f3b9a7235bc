"""QA: thousands of users or active requests, refreshed 4 times a second.

Every refresh that changed a figure (a live proxy's: all of them) cleared both tables and
added every row again, and the table measured every cell anew: with 2,000 users and as
many requests a refresh took over half a second here, and keys waited behind it. The same
rows in the same order now have only their changed cells written, in place."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable
from tui_support import FIXED_NOW, AdminServer, screen_text, until, until_fetched

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
            await until_fetched(pilot, lambda: users.row_count > 100 and requests.row_count > 50,
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


async def test_the_count_follows_requests_past_the_rows_shown() -> None:
    """Only the oldest 500 requests are rows; the subtitle counts them all. Requests
    that end past those rows change no row, and the count must still follow."""
    srv = AdminServer("saturated")
    first = srv.requests[0]
    srv.requests = [{**first, "id": f"r-{i}", "age_s": 1000.0 - i} for i in range(600)]
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            await until_fetched(pilot, lambda: "600 active · 100 not shown" in screen_text(app),
                        what="the count")
            del srv.requests[550:]  # the youngest 50 end: the 500 rows stay as they were
            assert await app.refresh_now()
            await until(pilot, lambda: "550 active · 50 not shown" in screen_text(app),
                        what="the new count")
    finally:
        await srv.stop()
