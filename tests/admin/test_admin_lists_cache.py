"""The ``/requests`` lists kept for ``max_age`` callers stay bounded (QA: every distinct
``limit`` kept its own body forever — 15 limits over recent long answers grew the process
from 121 to 247 MB), over a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from admin_support import T0, FedAggregator, admin_servers

from llmtop.admin.routes import MAX_AGE_LIMIT_S, REQUEST_LISTS_MAX, AdminContext
from llmtop.events import RequestRecord

CHUNKS = 400


def _rec(i: int) -> RequestRecord:
    offs = tuple(0.2 + 0.003 * k + i * 1e-7 for k in range(CHUNKS))
    return RequestRecord(f"r{i}", "alice", "m", "openai", "/v1/chat/completions", True, 200,
                         "ok", T0 + i, 0.2, offs[-1], 10, CHUNKS, "usage", offs,
                         (1,) * CHUNKS, 1)


class Admin:
    def __init__(self, url: str, ctx: AdminContext) -> None:
        self.url = url + "/llmtop/v1/requests"
        self.ctx = ctx

    async def get(self, query: str) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}?{query}") as r:
            assert r.status == 200
            body: list[dict[str, Any]] = await r.json()
            return body

    def held_bytes(self) -> int:
        return sum(len(b) for _, b in self.ctx.request_lists.values())


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    fed = FedAggregator()
    fed.now = T0 + 100
    for i in range(60):
        fed.bus.publish(_rec(i))
    fed.bus.drain()
    fed.aggregator.flush()
    ctx = fed.context()
    async with admin_servers() as servers:
        yield Admin(await servers.serve(ctx), ctx)


async def test_many_different_limits_keep_a_bounded_number_of_lists(admin: Admin) -> None:
    for limit in range(1, 41):
        rows = await admin.get(f"state=recent&limit={limit}&max_age=5")
        assert len(rows) == limit and rows[-1]["id"] == "r59"
    await admin.get("state=active&max_age=5")
    assert len(admin.ctx.request_lists) <= REQUEST_LISTS_MAX
    assert ("active", 0) in admin.ctx.request_lists  # the newest is kept
    assert ("recent", 40) in admin.ctx.request_lists
    assert ("recent", 1) not in admin.ctx.request_lists  # the oldest went first
    # a list dropped is simply built again, with the right rows
    rows = await admin.get("state=recent&limit=3&max_age=5")
    assert [r["id"] for r in rows] == ["r57", "r58", "r59"]


async def test_the_lists_kept_stay_under_the_byte_budget(admin: Admin) -> None:
    await admin.get("state=recent&limit=10&max_age=5")
    one = admin.held_bytes()
    assert one > 10 * CHUNKS * 5  # long answers: every offset in the body
    admin.ctx.request_lists.clear()
    admin.ctx.request_lists_max_bytes = budget = 3 * one  # ~3 lists of 10 long answers
    for limit in (10, 11, 12, 13, 14, 15):
        await admin.get(f"state=recent&limit={limit}&max_age=5")
        assert admin.held_bytes() <= budget
    assert 1 <= len(admin.ctx.request_lists) < 6
    admin.ctx.request_lists_max_bytes = 1  # smaller than any list: the newest alone stays
    await admin.get("state=recent&limit=50&max_age=5")
    assert list(admin.ctx.request_lists) == [("recent", 50)]


async def test_a_list_too_old_for_any_max_age_is_dropped(admin: Admin) -> None:
    stale_at = time.monotonic() - MAX_AGE_LIMIT_S - 1
    admin.ctx.request_lists[("recent", 7)] = (stale_at, b"[]")
    rows = await admin.get("state=recent&limit=7&max_age=10")  # too old to serve
    assert len(rows) == 7
    admin.ctx.request_lists[("recent", 9)] = (stale_at, b"[]")
    await admin.get("state=recent&limit=8&max_age=5")
    assert ("recent", 9) not in admin.ctx.request_lists
    assert set(admin.ctx.request_lists) == {("recent", 7), ("recent", 8)}


async def test_lists_within_max_age_are_still_shared(admin: Admin) -> None:
    first = await admin.get("state=recent&limit=5&max_age=5")
    admin.ctx.aggregator.on_events([_rec(99)])
    admin.ctx.aggregator.flush()
    assert await admin.get("state=recent&limit=5&max_age=5") == first  # built once
    fresh = await admin.get("state=recent&limit=5")
    assert fresh[-1]["id"] == "r99"
