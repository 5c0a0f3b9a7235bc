"""TTFT is filed when a stream's first token is seen, not when the request ends.

QA: 12 streams with a 2 s TTFT, then 40 s of tokens: the TTFT view read n/a for 43 s (the
samples came with the records). A tick now files a stream's TTFT the first time it sees
its first token; its record then adds no second sample (its TTFT objective is still judged
with the record)."""

from __future__ import annotations

from metrics_records import Clock, record

from llmtop.config import Config, SloConfig
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator

NS = 1_000_000_000


def ttft_count(agg: Aggregator, window: int | None) -> int:
    return int(agg.snapshot(window)["latency"]["ttft"]["count"])


def test_a_long_streams_ttft_shows_when_its_first_token_comes_and_counts_once() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    cfg = Config(slo=SloConfig(ttft_s=1.0))
    agg = Aggregator(cfg, reg, clock=clock)
    t_start = clock.t
    a = ActiveRequest("long", "alice", "m", "openai", "/v1/chat/completions", True, t_start,
                      t0_ns=5 * NS)
    reg["long"] = a
    agg.tick()
    assert ttft_count(agg, 10) == 0
    clock.advance(2.0)
    a.first_token_ns = a.t0_ns + 2 * NS  # 2 s TTFT
    a.tokens = a.chunks = 1
    agg.tick()
    snap = agg.snapshot(10)
    assert snap["latency"]["ttft"]["count"] == 1
    assert 1.9 <= snap["latency"]["ttft"]["p50"] <= 2.1
    user = next(u for u in snap["users"] if u["user"] == "alice")
    assert user["ttft_p50"] is not None and 1.9 <= user["ttft_p50"] <= 2.1
    for _ in range(80):  # 40 s of tokens; later ticks file nothing more
        clock.advance(0.5)
        a.tokens += 10
        a.chunks += 10
        agg.tick()
    assert ttft_count(agg, None) == 1
    assert ttft_count(agg, 10) == 0  # it was 40 s ago
    del reg["long"]
    clock.advance(0.2)
    agg.on_events([record(rid="long", user="alice", model="m", t_start=t_start, ttft=2.0,
                          gaps=[40.0 / 800] * 800)])
    agg.tick()
    snap = agg.snapshot(None)
    assert snap["latency"]["ttft"]["count"] == 1  # counted once
    assert snap["system"]["requests"] == 1
    assert snap["system"]["slo_met"] == 0  # still judged by its record: 2 s > 1 s
    user = next(u for u in snap["users"] if u["user"] == "alice")
    assert user["ttft_p50"] is not None


def test_a_request_finished_between_ticks_is_counted_from_its_record() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    agg.tick()
    clock.advance(0.4)
    agg.on_events([record(rid="short", t_start=clock.t - 0.3, ttft=0.1)])
    agg.tick()
    assert ttft_count(agg, 10) == 1
    # one seen waiting by a tick, then finished before the next: also from its record
    a = ActiveRequest("w", "bob", "m", "openai", "/v1/chat/completions", True, clock.t,
                      t0_ns=0)
    reg["w"] = a
    agg.tick()
    clock.advance(0.5)
    del reg["w"]
    agg.on_events([record(rid="w", user="bob", t_start=a.t_start, ttft=0.2)])
    agg.tick()
    assert ttft_count(agg, None) == 2


def test_a_non_streamed_request_has_no_ttft_sample_live_or_at_its_end() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    a = ActiveRequest("ns", "carol", "m", "openai", "/v1/chat/completions", False, clock.t,
                      t0_ns=0, first_token_ns=NS, tokens=5, chunks=1)
    reg["ns"] = a
    agg.tick()
    assert ttft_count(agg, 10) == 0
