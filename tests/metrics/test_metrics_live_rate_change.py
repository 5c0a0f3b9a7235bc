"""Live tokens/s across a change of a model's learned tokens per event.

QA (16k-token reasoning answers): when the model's rate moved (1.0 → 1.076) each open
stream's whole count so far was re-rated in one tick (a long user read 150 → 263 tok/s),
and its end took the over-attribution back at once (−82 tok/s in the 10 s window). Now
only the events since the last tick take the new rate, and an over-attribution is taken
back without any interval's output tokens going below zero.
"""

from __future__ import annotations

from metrics_records import Clock, open_stream, record

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator

RATE = 150  # events a second of the long stream (one event a chunk, one token an event)
TICK = 0.5


def user_tps(snap: dict[str, object], user: str) -> float:
    users = snap["users"]
    assert isinstance(users, list)
    return next((float(u["output_tps"]) for u in users if u["user"] == user), 0.0)


def finish(agg: Aggregator, reg: dict[str, ActiveRequest], a: ActiveRequest, usage: int
           ) -> None:
    """``a`` ends: its record (one chunk per event, ``usage`` tokens by the engine)."""
    del reg[a.id]
    n = a.chunks
    agg.on_events([record(rid=a.id, user=a.user, model="m", t_start=a.t_start, ttft=0.01,
                          gaps=[(agg.clock() - a.t_start - 0.02) / n] * (n - 1),
                          completion_tokens=usage)])


def test_a_rate_change_moves_only_new_events_and_the_end_never_goes_negative() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    # the model's first request teaches one token an event
    a = open_stream(reg, "teach", "t", clock.t)
    for _ in range(4):
        clock.advance(TICK)
        a.tokens += 10
        a.chunks += 10
        agg.tick()
    finish(agg, reg, a, usage=40)
    assert agg.tokens_per_event.get("m", 1.0) == 1.0

    long = open_stream(reg, "long", "long", clock.t)
    packed = open_stream(reg, "packed", "p", clock.t)
    long_tps: list[float] = []
    for i in range(int(120 / TICK)):
        clock.advance(TICK)
        long.tokens += int(RATE * TICK)
        long.chunks += int(RATE * TICK)
        if packed.id in reg:
            packed.tokens += 10
            packed.chunks += 10
        agg.tick()
        if i == int(20 / TICK):
            # another request of the model ends: 2 tokens an event → its rate moves to 1.3
            finish(agg, reg, packed, usage=2 * packed.tokens)
            assert abs(agg.tokens_per_event["m"] - 1.3) < 1e-9
        long_tps.append(user_tps(agg.snapshot(10), "long"))
    # steady: 150 tok/s before, 195 after (the new rate on new events), never a jump (the
    # window's edges read up to ~5% over a steady rate: ticks attribute whole half-seconds)
    before = max(long_tps[int(12 / TICK):int(20 / TICK)])
    assert 0.98 * RATE <= before <= 1.06 * RATE
    assert max(long_tps) <= 1.3 * before * 1.01, max(long_tps)
    steps = [b - a for a, b in zip(long_tps[int(12 / TICK):], long_tps[int(12 / TICK) + 1:],
                                   strict=False)]
    assert max(steps) < 10, max(steps)  # the old code re-rated 20 s of events: +90 tok/s
    assert 1.3 * RATE * 0.98 <= long_tps[-1] <= 1.3 * RATE * 1.06

    # the long request ends; its engine counted one token an event: ~4,500 tokens were
    # over-attributed, more than its last 10 s hold
    events = long.tokens
    finish(agg, reg, long, usage=events)
    for _ in range(int(30 / TICK)):
        snap = agg.snapshot(10)
        assert snap["system"]["output_tps"] >= 0, snap["system"]["output_tps"]
        assert user_tps(snap, "long") >= 0
        clock.advance(TICK)
        agg.tick()
    assert all(p["output_tps"] >= 0 for p in agg.series)
    teach_and_packed = 40 + 2 * 10 * (int(20 / TICK) + 1)
    # over-attributed tokens still owed are taken from the next ones in the shorter
    # windows; the session's totals are the engine's counts at once
    snap = agg.snapshot(None)
    assert snap["system"]["output_tokens"] == teach_and_packed + events
    assert next(u for u in snap["users"] if u["user"] == "long")["output_tokens"] == events
    assert agg._owed  # still owed by the windows

    # later answers of that user (finished between ticks) pay what is owed: totals exact
    later = 0
    for _ in range(10):
        clock.advance(1.0)
        agg.on_events([record(rid=None, user="long", model="m", t_start=clock.t - 0.5,
                              ttft=0.1, gaps=[0.001] * 499)])
        later += 500
        agg.tick()
    snap = agg.snapshot(None)
    assert snap["system"]["output_tokens"] == teach_and_packed + events + later
    long_row = next(u for u in snap["users"] if u["user"] == "long")
    assert long_row["output_tokens"] == events + later
    assert all(p["output_tps"] >= 0 for p in agg.series)


def test_live_learning_counts_the_events_a_read_carried() -> None:
    """Reads carrying four events each (one token an event): the rate learned is 1, not
    what counting each read after the last tick as one event taught (above 1)."""
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    a = open_stream(reg, "r", "u", clock.t)
    for _ in range(4):
        clock.advance(TICK)
        a.tokens += 40
        a.chunks += 10
        agg.tick()
    clock.advance(0.4)
    agg.on_events([record(rid="r", user="u", model="m", t_start=a.t_start, ttft=0.01,
                          gaps=[0.05] * 49, tokens=[4] * 50)])  # 10 reads after the tick
    del reg["r"]
    assert agg.tokens_per_event.get("m", 1.0) == 1.0
