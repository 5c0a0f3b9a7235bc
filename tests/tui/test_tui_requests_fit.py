"""The active-requests table fits its width: long ids, users and models are cut with "…"
and, narrower still, whole columns are left out (the request id first), never a value
cut off at the panel's edge."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.widgets.requests import COLUMNS, KEEP, PAD, fit_columns

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def long_requests(src: FixtureSource, n: int = 5) -> None:
    """Requests as a real proxy shows them: uuid-like ids, e-mail users, long models
    (few enough that all show at 80×24)."""
    src.requests = [
        {"id": f"chatcmpl-99211007-{i:04x}-4c1d-9f0e", "user": f"team-{i}@corp.example.com",
         "model": MODEL, "state": "streaming" if i % 2 else "waiting", "age_s": 12.5 - i,
         "completion_tokens": 1234 + i, "tps": 45.6}
        for i in range(n)
    ]


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (160, 48), (200, 50)],
                         ids=["80x24", "120x30", "160x48", "200x50"])
async def test_requests_table_fits_and_keeps_the_figures(size: tuple[int, int]) -> None:
    """At every width the user, state, age and tokens of each request show whole (the
    columns shown fit the table), the long text columns are cut with "…", and at 200
    columns every column is there."""
    src = FixtureSource("saturated")
    long_requests(src)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        table = app.dashboard.requests
        if size[0] < 120:
            await pilot.press("tab")  # the requests table instead of the users
        await until(pilot, lambda: table.row_count == len(src.requests), what="rows")
        await pilot.pause()
        text = screen_text(app)
        shown = table.shown_columns
        assert sum(w + 2 * PAD for w in shown.values()) <= table.size.width
        for key in ("user", "state", "age", "tokens"):
            assert key in shown, (size, shown)
        if size[0] >= 200:
            assert list(shown) == [key for key, _, _ in COLUMNS]
        lines = text.splitlines()
        for r in src.requests:
            line = next((x for x in lines if fmt.latency(r["age_s"]) in x), "")
            assert line, f"the request aged {fmt.latency(r['age_s'])} is not on screen"
            assert fmt.count(r["completion_tokens"]) in line, line
            assert r["state"] in line, line
            user = r["user"]
            assert user in line or user[: shown["user"] - 1] + "…" in line, line
            if "model" in shown and shown["model"] < len(MODEL):
                assert MODEL[: shown["model"] - 1] + "…" in line, line


def test_fit_columns_drops_the_least_useful_first() -> None:
    """Text columns shrink to their minimum first; then whole columns go in reverse
    KEEP order (id, tok/s, model...); what is left over goes back to user, model, id."""
    natural = {"id": 14, "user": 20, "model": 24, "state": 9, "age": 7, "tokens": 7,
               "tps": 6}
    everything = sum(natural.values()) + 2 * PAD * len(natural)
    assert fit_columns(natural, everything) == natural
    assert fit_columns(natural, 10_000) == natural
    squeezed = fit_columns(natural, everything - 10)
    assert list(squeezed) == list(natural) and sum(squeezed.values()) == sum(
        natural.values()) - 10
    widths = [fit_columns(natural, w) for w in range(everything, 0, -1)]
    dropped_order: list[str] = []
    for w in widths:
        for key in natural:
            if key not in w and key not in dropped_order:
                dropped_order.append(key)
    assert dropped_order == list(reversed(KEEP))[: len(dropped_order)]
    assert list(fit_columns(natural, 12)) == ["user"]
    assert fit_columns(natural, 3)["user"] >= 1


@pytest.mark.parametrize("size", [(40, 12), (80, 24), (120, 40)],
                         ids=["40x12", "80x24", "120x40"])
async def test_one_users_requests_drop_the_user_and_keep_what_matters(
        size: tuple[int, int]) -> None:
    """One user's detail listed the user's name on every request row (the same name:
    the title says whose requests these are), and at 40 columns that column took the
    room ("batch-j…  sim-8b  waiting  9.50 s": no tokens, no TTFT). Now there is no
    user column there, the TTFT column says "waiting" until the first token (the state
    in one column less), and at 40 columns model, TTFT, age and tokens show whole."""
    from llmtop.tui.screens.user_detail import UserDetail

    src = FixtureSource("saturated")
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user("batch-job")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        screen = app.screen
        assert isinstance(screen, UserDetail)
        table = screen.requests
        mine = [r for r in src.requests if r["user"] == "batch-job"]
        await until(pilot, lambda: table.row_count == len(mine), what="the user's requests")
        await pilot.pause()
        shown = table.shown_columns
        assert "user" not in shown and "state" not in shown, shown
        for key in ("model", "ttft", "age", "tokens"):
            assert key in shown, (size, shown)
        assert sum(w + 2 * PAD for w in shown.values()) <= table.size.width
        cells = [c.plain for i in range(table.row_count) for c in table.get_row_at(i)]
        assert not any("batch-j" in c for c in cells), cells
        lines = screen_text(app).splitlines()
        first = mine[0]  # the oldest, the one row kept at 40×12
        assert first["ttft_s"] is None
        row = next((x for x in lines if fmt.latency(first["age_s"]) in x), "")
        assert "waiting" in row and first["model"] in row, row
        assert fmt.count(first["completion_tokens"]) in row, row
        if size[1] > 12:
            started = next(r for r in mine if r["ttft_s"] is not None)
            row = next(x for x in lines if fmt.latency(started["age_s"]) in x)
            assert fmt.latency(started["ttft_s"]) in row and "waiting" not in row, row


async def test_the_folds_requests_keep_the_user_column() -> None:
    """The detail of "(others)" lists several users' requests: its rows say whose."""
    from llmtop.tui.screens.user_detail import UserDetail
    from llmtop.tui.snapview import FOLD_KEY

    src = FixtureSource("saturated")
    tracked = {"batch-job", "alice"}
    src.snapshot["users"] = [u for u in src.snapshot["users"] if u["user"] in tracked]
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        app.open_user(FOLD_KEY)
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        screen = app.screen
        assert isinstance(screen, UserDetail)
        others = [r for r in src.requests if r["user"] not in tracked]
        assert others
        await until(pilot, lambda: screen.requests.row_count == len(others), what="rows")
        await pilot.pause()
        shown = screen.requests.shown_columns
        assert "user" in shown and "ttft" in shown, shown
        text = screen_text(app)
        assert all(r["user"] in text for r in others), text
