"""Review of the tables that make a row's cells only when it is drawn (0f67b05..697eb96):
after each of a fixed run of refreshes and keys (figures that move in and out of view,
users and requests that come and go, a fold row and a duplicated name, sorts, filters,
the theme, the SLO, narrow widths and the tab swap, scrolling and the cursor), every row
as the screen draws it (text and style) must be what it draws once every row's cells
are made afresh. The app is fed by a real admin API over a socket."""

from __future__ import annotations

import random
from typing import Any

from textual.widgets import DataTable
from tui_support import FIXED_NOW, AdminServer, until_fetched

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource
from llmtop.tui.widgets.requests import RequestsTable
from llmtop.tui.widgets.users import UsersTable

Drawn = dict[int, list[tuple[str, str]]]


def drawn(table: DataTable[Any]) -> Drawn:
    """Every row as drawn (its segments' text and style), scrolling through the table."""
    n, h = table.row_count, table.size.height
    out: Drawn = {}
    if h <= 1 or n == 0:
        return out
    was, y = table.scroll_y, 0
    while True:
        table.scroll_to(y=y, animate=False, immediate=True)
        top = int(table.scroll_y)
        for row in range(top, min(n, top + h - 1)):
            out[row] = [(s.text, str(s.style)) for s in table.render_line(row - top + 1)]
        if top + h - 1 >= n:
            break
        y = top + h - 1
    table.scroll_to(y=was, animate=False, immediate=True)
    return out


def made_afresh(table: UsersTable | RequestsTable) -> None:
    """Every row's cells to be made again when drawn (the tables' own bookkeeping)."""
    if isinstance(table, UsersTable):
        table._cells = {}
        table._pending = set(table._want)
    else:
        table._pending = set(range(len(table._want)))
    table._shown_sig = {}
    table._update_count += 1


def differs(table: UsersTable | RequestsTable, seen: list[int]) -> tuple[int, str, str] | None:
    now = drawn(table)
    seen.append(len(now))
    made_afresh(table)
    fresh = drawn(table)
    for row in sorted(set(now) | set(fresh)):
        if now.get(row) != fresh.get(row):
            return (row, "".join(t for t, _ in now.get(row, [])),
                    "".join(t for t, _ in fresh.get(row, [])))
    return None


async def test_what_is_drawn_is_what_a_full_remake_draws() -> None:
    rng = random.Random(7)
    srv = AdminServer("many_users")
    snap = srv.snapshot
    users: list[dict[str, Any]] = snap["users"]
    users.append({"user": "other", "tracked": False, "requests": 5, "in_flight": 1,
                  "output_tps": 3.0, "ttft_p95": 0.2, "itl_p95": 0.01,
                  "slo_attainment": 0.9})
    users.insert(3, dict(users[5]))  # a merged snapshot's second row of one user
    requests: list[dict[str, Any]] = srv.requests
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(160, 40)) as pilot:
            utable, rtable = app.dashboard.users, app.dashboard.requests
            await until_fetched(pilot, lambda: utable.row_count == 152, what="the users")
            gone: list[dict[str, Any]] = []
            useen: list[int] = []
            rseen: list[int] = []
            steps = ["figures", "scroll", "figures", "S", "requests", "gone", "scroll",
                     "filter", "figures", "unfilter", "back", "s", "d", "slo", "narrow",
                     "tab", "requests", "figures", "tab", "wide", "figures", "requests"]
            for step, op in enumerate(steps):
                if op == "figures":  # in view and out of it
                    for u in rng.sample(users, 40):
                        key = rng.choice(["requests", "in_flight", "output_tps",
                                          "ttft_p95", "itl_p95", "slo_attainment"])
                        u[key] = None if rng.random() < 0.1 else round(rng.random() * 2, 3)
                elif op == "gone":
                    gone += [users.pop(rng.randrange(len(users))) for _ in range(3)]
                elif op == "back":
                    for u in gone:
                        users.insert(rng.randrange(len(users) + 1), u)
                    gone = []
                elif op == "requests":
                    for r in requests:
                        r["age_s"] = round(r["age_s"] + 0.5, 1)
                    del requests[rng.randrange(len(requests))]
                    requests.append({"id": f"new-{step}", "user": "user-3", "model": None,
                                     "state": "waiting", "age_s": 12.5,
                                     "completion_tokens": 0, "tps": None})
                elif op == "scroll":
                    for table in (utable, rtable):
                        table.scroll_to(y=rng.randrange(20, 60), animate=False,
                                        immediate=True)
                        table.move_cursor(row=rng.randrange(table.row_count), animate=False)
                elif op == "filter":
                    await pilot.press("slash", *"user-1", "enter")
                elif op == "unfilter":
                    await pilot.press("slash", "escape")
                elif op == "slo":
                    snap["slo"]["ttft_s"] = 0.1
                elif op == "narrow":
                    await pilot.resize_terminal(60, 30)
                elif op == "wide":
                    await pilot.resize_terminal(160, 40)
                else:  # s, S, d, tab
                    await pilot.press(op)
                await pilot.pause()
                assert await app.refresh_now()
                await pilot.pause()
                for table, seen in ((utable, useen), (rtable, rseen)):
                    wrong = differs(table, seen)
                    assert wrong is None, (step, op, type(table).__name__, wrong)
            # (not vacuous: most steps drew rows of both tables, narrow too)
            assert sum(n > 0 for n in useen) > 15 and sum(n > 0 for n in rseen) > 15, \
                (useen, rseen)
    finally:
        await srv.stop()
