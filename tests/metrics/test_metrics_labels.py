"""Bounded cardinality: the top N users get their own rows, the rest fold into "other"."""

from __future__ import annotations

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.labels import LabelSlots


def rows(agg: Aggregator, window: int | None = None) -> dict[str, dict]:
    return {u["user"]: u for u in agg.snapshot(window)["users"]}


def test_users_beyond_top_n_fold_into_other_and_totals_hold() -> None:
    clock = Clock()
    agg = Aggregator(Config(top_users=3), clock=clock)
    clock.advance(1)
    agg.on_events([record(user=u) for u in ("a", "b", "c", "d", "e", "d")])
    r = rows(agg)
    assert set(r) == {"a", "b", "c", "other"}
    assert r["other"]["requests"] == 3 and not r["other"]["tracked"]
    assert r["a"]["tracked"]
    snap = agg.snapshot(None)
    assert sum(u["requests"] for u in snap["users"]) == snap["system"]["requests"] == 6
    assert r["other"]["ttft_p95"] is not None
    assert snap["users_untracked"] == 2  # d and e, folded into other, active just now


def test_the_folded_users_recently_active_are_counted_and_fade() -> None:
    slots = LabelSlots(2, base=0, other_id=99)
    for name in ("a", "b", "c", "d", "e", "other"):
        slots.series_for(name)
    assert slots.untracked_recent() == 4  # c, d, e and a user named "other" (not the fold)
    slots.rebalance(60.0)  # one half-life: 1 request -> 0.5, still recent
    assert slots.untracked_recent() == 4
    slots.rebalance(180.0)  # 0.0625: none recent any more
    assert slots.untracked_recent() == 0


def test_a_heavier_newcomer_displaces_the_weakest_user() -> None:
    clock = Clock()
    agg = Aggregator(Config(top_users=2), clock=clock)
    clock.advance(1)
    agg.on_events([record(user="a")] * 1 + [record(user="b")] * 5)
    for _ in range(30):
        clock.advance(0.5)
        agg.on_events([record(user="heavy")])
        agg.tick()
    r = rows(agg)
    assert set(r) == {"b", "heavy", "other"}
    assert agg.users.demotions == 1
    # a's history and heavy's traffic before promotion are in "other"; nothing is lost
    snap = agg.snapshot(None)
    assert sum(u["requests"] for u in snap["users"]) == snap["system"]["requests"] == 36
    assert r["heavy"]["requests"] + r["other"]["requests"] == 31
    assert r["heavy"]["requests"] > 0


def test_untracked_scores_stay_bounded() -> None:
    slots = LabelSlots(capacity=4, base=2, other_id=1)
    for i in range(10_000):
        slots.series_for(f"client-{i}")
    assert len(slots.scores) <= 8 * 4 + 4 + 1
    assert len(slots.ids) == 4


def test_models_are_bounded_too() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    clock.advance(1)
    agg.on_events([record(model=f"m{i}") for i in range(20)] + [record(model=None)])
    models = {m["model"]: m for m in agg.snapshot(60)["models"]}
    assert len(models) == 17 and "other" in models
    assert sum(m["requests"] for m in models.values()) == 21
