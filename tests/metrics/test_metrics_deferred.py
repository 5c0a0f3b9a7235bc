"""Records are queued and filed in batches: readers still see every record at once, and
each record lands in the interval it arrived in, exactly as if filed on arrival."""

from __future__ import annotations

import random
from typing import Any

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import PENDING_CHUNKS, PENDING_RECORDS, Aggregator
from llmtop.metrics.ingest import C_REQ


def _traffic(rng: random.Random, n: int) -> list[RequestRecord]:
    return [
        record(user=f"u{rng.randrange(12)}", model=rng.choice(["a", "b"]),
               ttft=rng.uniform(0.05, 0.5),
               gaps=[rng.uniform(0.005, 0.08) for _ in range(rng.randrange(0, 12))],
               outcome=rng.choice(["ok"] * 8 + ["error", "cancelled"]),  # type: ignore[arg-type]
               concurrency=rng.randrange(1, 9))
        for _ in range(n)
    ]


def _run(filed_at_once: bool) -> list[dict[str, Any]]:
    rng = random.Random(7)
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(top_users=4), reg, clock=clock)
    snaps = []
    for step in range(300):  # 300 deliveries 50-250 ms apart: ~45 s, 20+ fine intervals
        clock.advance(rng.uniform(0.05, 0.25))
        agg.on_events(_traffic(rng, rng.randrange(0, 6)))
        if filed_at_once:
            agg.flush()
            assert agg.pending_records == 0
        if step % 5 == 0:
            agg.tick()
        if step % 60 == 59:
            snaps.extend(agg.snapshot(w) for w in (10, 60, 300, None))
    clock.advance(3.0)
    agg.tick()
    snaps.extend(agg.snapshot(w, user_histograms=True) for w in (10, 60, None))
    return snaps


def test_queued_filing_gives_the_same_snapshots_as_filing_each_delivery() -> None:
    queued, at_once = _run(False), _run(True)
    assert len(queued) == len(at_once) == 23
    for a, b in zip(queued, at_once, strict=True):
        a.pop("host"), b.pop("host")
        assert a == b
    assert sum(p["requests"] for p in queued[-1]["series"]) > 300


def test_a_reader_sees_queued_records_at_once() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([record(user="alice"), record(user="bob")])
    assert agg.pending_records == 2
    assert agg.records_seen == 2
    snap = agg.snapshot(10)
    assert agg.pending_records == 0
    assert snap["system"]["requests"] == 2
    assert snap["latency"]["ttft"]["count"] == 2
    agg.on_events([record(user="alice", ttft=1e9)])  # out of range: clamped
    assert agg.clamped == 2  # its TTFT and its E2E
    agg.on_events([record(user="alice", concurrency=3)])
    assert sum(b["requests"] for b in agg.capacity.bins()) == 4
    agg.on_events([record(user="carol")])
    assert int(agg.view(10).counters[0, C_REQ]) == 5


def test_records_are_filed_in_the_interval_they_arrived_in() -> None:
    clock = Clock(1_796_000_000.5)  # inside the fine interval [..000, ..002)
    agg = Aggregator(Config(), clock=clock)
    agg.on_events([record(), record()])
    clock.advance(5.0)  # two intervals close before anything reads
    agg.tick()
    points = {p["t"]: p["requests"] for p in agg.series}
    assert points[1_796_000_002.0] == 2
    assert points[1_796_000_004.0] == 0


def test_the_queue_is_filed_once_it_is_long() -> None:
    agg = Aggregator(Config(), clock=Clock())
    agg.on_events([record() for _ in range(PENDING_RECORDS - 1)])
    assert agg.pending_records == PENDING_RECORDS - 1
    agg.on_events([record()])
    assert agg.pending_records == 0
    long = record(gaps=[0.01] * PENDING_CHUNKS)  # one long stream is enough
    agg.on_events([record(), long])
    assert agg.pending_records == 0
    assert agg.snapshot(10)["system"]["requests"] == PENDING_RECORDS + 2


def test_a_batch_that_cannot_be_filed_is_dropped_and_counted() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    bad = record()
    object.__setattr__(bad, "chunk_offsets_s", ("not a number", "x"))  # a broken producer
    agg.on_events([bad, record()])
    clock.advance(3.0)
    agg.tick()  # filing at the interval's end: the tick still works
    assert agg.filing_errors == 1 and agg.last_filing_error is not None
    assert agg.pending_records == 0
    agg.on_events([record()])
    assert agg.snapshot(10)["system"]["requests"] == 1  # readers work on
    assert agg.filing_errors == 1
