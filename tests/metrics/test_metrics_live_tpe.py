"""Live tokens/s for engines that pack several tokens into one event.

QA: with 2–3 tokens an event and usage only at the end, the 10 s window read 34% low while
a long request streamed, then 4.8× high for the 10 s after it ended (the usage's remainder
landed at once). The aggregator now learns each model's tokens per event from finished
requests with usage and attributes live events at that rate."""

from __future__ import annotations

import time

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator


def stream(agg: Aggregator, clock: Clock, reg: dict[str, ActiveRequest], rid: str,
           model: str = "m") -> list[float]:
    """One 10 s request, 10 events a second (3 tokens each per the engine), ticked every
    second; returns the 10 s window's output tok/s after each tick; then its record
    (usage 300) arrives."""
    t_start = clock.t
    a = ActiveRequest(rid, "alice", model, "openai", "/v1/chat/completions", True, t_start,
                      time.perf_counter_ns(), first_token_ns=time.perf_counter_ns())
    reg[rid] = a
    agg.tick()
    seen = []
    for _ in range(10):
        clock.advance(1.0)
        a.tokens += 10
        agg.tick()
        seen.append(agg.snapshot(10)["system"]["output_tps"])
    del reg[rid]
    clock.advance(0.1)
    agg.on_events([record(rid=rid, model=model, t_start=t_start, ttft=0.1,
                          gaps=[0.1] * 99, completion_tokens=300)])
    return seen


def test_live_rate_follows_the_engines_tokens_per_event() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    first = stream(agg, clock, reg, "r1")
    assert 8 <= first[-1] <= 12  # nothing learned yet: one token an event, 3× low
    assert agg.tokens_per_event["m"] == 3.0  # 300 tokens / 100 events
    clock.advance(12.0)  # let the first request's window pass
    agg.tick()
    second = stream(agg, clock, reg, "r2")
    assert 27 <= second[-1] <= 33, second  # ≈ 30 tok/s while it streams
    before = agg.snapshot(None)["system"]["output_tokens"]
    assert before == 600  # the record's usage settles the total exactly
    clock.advance(1.0)
    agg.tick()
    after = agg.snapshot(10)["system"]["output_tps"]
    assert after <= 33, after  # no burst once it ends (was the 200-token remainder)


def test_one_token_an_event_is_left_alone_and_models_apart() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    t0 = clock.t
    a = ActiveRequest("x", "bob", "plain", "openai", "/v1/chat/completions", True, t0,
                      time.perf_counter_ns(), first_token_ns=time.perf_counter_ns())
    reg["x"] = a
    for _ in range(10):
        clock.advance(1.0)
        a.tokens += 10
        agg.tick()
    del reg["x"]
    agg.on_events([record(rid="x", model="plain", t_start=t0, ttft=0.1, gaps=[0.1] * 99,
                          completion_tokens=100)])
    assert agg.tokens_per_event["plain"] == 1.0
    stream(agg, clock, reg, "y", model="packed")
    assert agg.tokens_per_event == {"plain": 1.0, "packed": 3.0}
