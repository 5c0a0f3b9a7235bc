"""The count of users folded into "other" (``users_untracked``, the TUI's "+ ≈N others")
holds past the memory bound of ``8 × top_users`` remembered untracked users (QA #13: 500
users against the default top 20 read "≈160 others", not ≈480)."""

from __future__ import annotations

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.labels import LabelSlots


def test_many_folded_users_are_counted_past_the_memory_bound() -> None:
    for n in (200, 500, 5000):
        slots = LabelSlots(20, base=2, other_id=1)
        for i in range(n):
            slots.series_for(f"user-{i:05d}@example.com")
        assert len(slots.scores) <= 8 * 20 + 20 + 1  # memory stays bounded
        folded = n - 20
        assert abs(slots.untracked_recent() - folded) <= 0.1 * folded, (n, folded)
        slots.rebalance(60.0)  # one half-life: still recent
        assert abs(slots.untracked_recent() - folded) <= 0.1 * folded
        slots.rebalance(90.0)  # 150 s after their one request: none recent any more
        assert slots.untracked_recent() == 0


def test_a_few_folded_users_are_still_counted_exactly() -> None:
    """Below the bound the count is the remembered scores' (exact), as before."""
    slots = LabelSlots(20, base=2, other_id=1)
    for i in range(60):
        slots.series_for(f"u{i}")
    slots.series_for("u59")
    assert slots.untracked_recent() == 40


def test_snapshot_counts_500_users_past_the_top_20() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)  # top_users 20
    clock.advance(1)
    agg.on_events([record(user=f"user-{i:03d}@example.com") for i in range(500)])
    snap = agg.snapshot(None)
    assert sum(1 for u in snap["users"] if u["tracked"]) == 20
    assert 460 <= snap["users_untracked"] <= 500  # 480 folded, give or take the sketch
