"""The take-back scenario the over-attribution tests share: an answer that ends with fewer
tokens than were attributed to it live, while another user's stream goes on."""

from __future__ import annotations

from typing import NamedTuple

from metrics_records import Clock, open_stream, record

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator


class TakeBack(NamedTuple):
    clock: Clock
    agg: Aggregator
    bob: ActiveRequest
    """Bob's stream, still open (model ``m``)."""


def alice_ends_over_attributed() -> TakeBack:
    """Alice and Bob stream model ``m`` for 30 s, 100 events a second each, ticked every
    0.5 s, at a learned 1.5 tokens an event; then Alice's answer ends, the engine's usage
    saying 3,000 tokens, one an event: 4,500 were attributed, 1,500 are taken back."""
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    agg.tokens_per_event["m"] = 1.5  # learned from earlier answers that packed tokens
    alice = open_stream(reg, "A", "alice", clock.t)
    bob = open_stream(reg, "B", "bob", clock.t)
    for _ in range(60):  # 30 s, 100 events/s each
        clock.advance(0.5)
        for a in (alice, bob):
            a.tokens += 50
            a.chunks += 50
        agg.tick()
    del reg["A"]  # the engine's usage: 3,000 tokens, one an event (4,500 attributed)
    agg.on_events([record(rid="A", user="alice", model="m", t_start=alice.t_start,
                          gaps=[0.01] * 2999, completion_tokens=3000)])
    return TakeBack(clock, agg, bob)
