"""A user promoted out of "other" while its stream is open does not read negative tokens.

With every user slot taken, a new user's live tokens are counted in "other"; the rebalance
(every 10 s) can then give it a slot of its own. When its stream ended, the whole
correction (usage less what was attributed live) went to the new slot, which held only the
ticks since the promotion: a stream attributed 2 tokens an event whose usage said 1 left the
user's all-time row at -900 tokens (llmtop_user_output_tokens_total below zero) while
"other" kept 1,960 of a system's 1,060. Now a request's tokens follow it: the windows keep
live tokens where they were counted and take the correction back there, and the all-time
rows move each request's tokens to the row its record is counted in, so every all-time row
holds exactly the engines' counts of its own requests.
"""

from __future__ import annotations

from metrics_records import T0, Clock, open_stream, record
from test_metrics_prometheus import scrape, value

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator


def test_a_user_promoted_mid_stream_reads_its_own_requests_tokens() -> None:
    clock = Clock(T0 + 0.1)
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(top_users=1), reg, clock=clock)
    agg.tokens_per_event["m"] = 2.0
    agg.on_events([record(user="a", completion_tokens=10)])  # a takes the one slot
    b = open_stream(reg, "B", "b", clock.t)
    agg.on_events([record(user="b", completion_tokens=10) for _ in range(5)])  # in "other"
    for _ in range(20):  # 10 s: the rebalance promotes b near the end
        clock.advance(0.5)
        b.tokens += 50
        b.chunks += 50
        agg.tick()
    assert "b" in agg.users.ids
    del reg["B"]
    agg.on_events([record(rid="B", user="b", model="m", t_start=b.t_start,
                          gaps=[0.01] * (b.tokens - 1), completion_tokens=b.tokens)])
    for _ in range(40):
        clock.advance(0.5)
        agg.tick()
        for w in (10, 60, None):
            snap = agg.snapshot(w)
            rows = {(u["user"], u["tracked"]): u["output_tokens"] for u in snap["users"]}
            assert all(t >= 0 for t in rows.values()), (w, rows)
            assert sum(rows.values()) == snap["system"]["output_tokens"], (w, rows)
    snap = agg.snapshot(None)
    rows = {(u["user"], u["tracked"]): (u["requests"], u["output_tokens"])
            for u in snap["users"]}
    # b's 5 short answers stay in "other" (before the promotion); its stream is its own
    assert rows == {("b", True): (1, 1000), ("other", False): (6, 60)}, rows
    assert snap["system"]["output_tokens"] == 1060
    assert value(scrape(agg), "llmtop_user_output_tokens_total", user="b") == 1000
