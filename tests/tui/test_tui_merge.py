"""`attach` with several proxies: real snapshots from two aggregators, served over
sockets, merged exactly by llmtop.metrics.merge and shown as one system."""

from __future__ import annotations

import itertools
from typing import Any

from tui_support import AdminServer, screen_text, shows, until

from llmtop.config import Config
from llmtop.events import RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource

T0 = 1_796_000_000.0
_ids = itertools.count()


def request(user: str, ttft: float, t_start: float) -> RequestRecord:
    offs = tuple(ttft + 0.02 * i for i in range(10))
    return RequestRecord(
        id=f"r{next(_ids)}", user=user, model="m", dialect="openai",
        path="/v1/chat/completions", stream=True, status=200, outcome="ok",
        t_start=t_start, ttft_s=ttft, e2e_s=offs[-1] + 0.001, prompt_tokens=10,
        completion_tokens=10, token_source="usage", chunk_offsets_s=offs,
        chunk_tokens=(1,) * 10, concurrency_at_start=1,
    )


def proxy_snapshot(user: str, ttft: float, n: int) -> dict[str, Any]:
    """The snapshot (with per-user histograms) of one proxy that served ``n`` requests."""
    now = [T0]
    agg = Aggregator(Config(), clock=lambda: now[0], upstream="http://engine:8000")
    for i in range(n):
        now[0] = T0 + i * 0.5
        agg.on_events([request(user, ttft, now[0] - 1.0)])
        agg.tick(now[0])
    now[0] += 1.0
    agg.tick(now[0])
    return agg.snapshot(60, user_histograms=True)


async def test_two_proxies_merge_into_one_view_and_one_can_go_down() -> None:
    """Two proxies (alice fast on one, bob slow on the other) show as one system: both
    users, the summed request count and TTFT p99 from the merged histograms; when one
    stops, the header names it and the other keeps showing."""
    a, b = AdminServer("low_load"), AdminServer("low_load")
    a.snapshot, a.requests = proxy_snapshot("alice", 0.1, 30), []
    b.snapshot, b.requests = proxy_snapshot("bob", 0.9, 10), []
    await a.start()
    await b.start()
    app = LlmtopApp(AdminSource([a.url, b.url], timeout_s=1.0), refresh_hz=10, retry_s=0.1)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await shows(pilot, "bob")
            assert app.view.num("system", "requests") == 40
            assert 0.85 <= (app.view.num("latency", "ttft", "max") or 0) <= 0.95
            assert 0.85 <= (app.view.num("latency", "ttft", "p99") or 0) <= 0.95
            assert 0.09 <= (app.view.num("latency", "ttft", "p50") or 0) <= 0.11
            text = screen_text(app)
            assert "alice" in text and "via 2 proxies" in text
            assert a.queries[-1].get("user_histograms") == "1"
            await b.stop()
            await shows(pilot, "1/2 proxies up · down:")
            await until(pilot, lambda: app.view.num("system", "requests") == 30)
            assert "alice" in screen_text(app)
    finally:
        await a.stop()
        await b.stop()
