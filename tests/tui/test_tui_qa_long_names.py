"""QA: 1,000 users named by their service, differing only at the end.

Users "svc-inference-gateway-prod-eu-west-1-worker-000" … "-999" all read
"svc-inference-gateway-prod-…" in the users table: a thousand identical rows, the one
hogging the proxy impossible to name. Names cut to the same label are now cut in the
middle, keeping the end that tells them apart; a name alone in its label is cut at the
end as before."""

from __future__ import annotations

import re

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp

PREFIX = "svc-inference-gateway-prod-eu-west-1-worker-"


def many(n: int) -> FixtureSource:
    src = FixtureSource("many_users")
    base = src.snapshot["users"][0]
    src.snapshot["users"] = [
        {**base, "user": f"{PREFIX}{i:03d}", "output_tps": 1000.0 - i} for i in range(n)]
    return src


@pytest.mark.parametrize("size", [(160, 48), (80, 24), (40, 12)])
async def test_a_thousand_users_with_a_common_prefix_stay_apart(size: tuple[int, int]) -> None:
    app = LlmtopApp(many(1000), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 1000
                    and re.search(r"svc-\S*…001\b", screen_text(app)) is not None,
                    what="the users drawn")
        text = screen_text(app)
        labels = [table.get_row_at(i)[0].plain for i in range(table.row_count)]
    assert len(labels) == 1000
    assert len(set(labels)) == 1000, labels[:5]
    assert labels[0].endswith("…000") and labels[1].endswith("…001"), labels[:3]
    # what is on screen tells the top rows apart too
    assert re.search(r"svc-\S*…000\b", text) and re.search(r"svc-\S*…001\b", text), text


def test_names_cuts_apart_only_what_would_collide() -> None:
    got = fmt.names([f"{PREFIX}017", f"{PREFIX}018", "alice", "a-very-long-user-name-alone-x"],
                    12)
    assert got == ["svc-infe…017", "svc-infe…018", "alice", "a-very-long…"]
    assert fmt.names(["模型" * 20 + "a", "模型" * 20 + "b"], 12) == ["模型模型模…a", "模型模型模…b"]
    assert fmt.names(["", "x"], 10) == ["(empty)", "x"]
    assert fmt.names([PREFIX + "1", PREFIX + "1"], 12) == ["svc-inferen…"] * 2  # same name


async def test_active_requests_keep_users_and_models_apart() -> None:
    """The same in the active requests: two models differing only in their quantisation
    both read "meta-llama/Llama-3.…"."""
    src = many(3)
    base = src.requests[0]
    models = ["meta-llama/Llama-3.1-70B-Instruct-FP8", "meta-llama/Llama-3.1-70B-Instruct-AWQ"]
    src.requests = [{**base, "id": f"r{i}", "user": f"{PREFIX}{i:03d}", "model": models[i % 2],
                     "age_s": 5.0 - i} for i in range(4)]
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        table = app.dashboard.requests
        await until(pilot, lambda: table.row_count == 4, what="the requests listed")
        cols = list(table.shown_columns)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
    users = [r[cols.index("user")].plain for r in rows]
    models_shown = [r[cols.index("model")].plain for r in rows]
    assert len(set(users)) == 4, users
    assert len(set(models_shown)) == 2, models_shown
    assert all(m.endswith(("FP8", "AWQ")) for m in models_shown), models_shown
