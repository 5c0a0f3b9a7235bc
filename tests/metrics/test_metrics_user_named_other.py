"""A real user (or model) named "other" is not the fold of those past the top N.

QA: ``X-LLMTop-User: other`` was counted in the fold named "other" — the per-user table,
the snapshot and /metrics showed one row, and a merge of proxies added the fold to the
user. The fold keeps its name (``tracked`` false; ``user="other"`` in /metrics); the user
has a row of its own (``tracked`` true; ``user="other_"`` in /metrics, the names
``other_``, ``other__``... one ``_`` more each, so no two series share a label value).
"""

from __future__ import annotations

from typing import Any

from metrics_records import Clock, record
from test_metrics_prometheus import scrape, value

from llmtop.config import Config
from llmtop.metrics.aggregator import MODEL_SLOTS, Aggregator
from llmtop.metrics.labels import OTHER, LabelSlots, label_value
from llmtop.metrics.merge import merge_snapshots


def _agg(users: list[str]) -> Aggregator:
    clock = Clock()
    agg = Aggregator(Config(top_users=2), clock=clock)
    clock.advance(1)
    agg.on_events([record(user=u) for u in users])
    agg.tick()
    return agg


def _rows(snap: dict[str, Any]) -> dict[tuple[str, bool], dict[str, Any]]:
    out: dict[tuple[str, bool], dict[str, Any]] = {}
    for u in snap["users"]:
        key = (u["user"], u["tracked"])
        assert key not in out, snap["users"]
        out[key] = u
    return out


# "other" takes the second slot; carl and dora (3 requests) fold
USERS = ["alice", "other", "other", "carl", "dora", "dora", "alice", "other"]


def test_a_user_named_other_has_its_own_row_apart_from_the_fold() -> None:
    snap = _agg(USERS).snapshot(None)
    r = _rows(snap)
    assert set(r) == {("alice", True), ("other", True), ("other", False)}
    assert r[("other", True)]["requests"] == 3  # the user's own
    assert r[("other", False)]["requests"] == 3  # carl and dora
    assert sum(u["requests"] for u in snap["users"]) == snap["system"]["requests"] == 8
    assert snap["users_untracked"] == 2  # carl and dora; the user "other" is tracked


def test_prometheus_labels_the_user_other_apart_from_the_fold() -> None:
    s = scrape(_agg(USERS))
    users = {x.labels["user"] for x in s["llmtop_user_requests_total"]}
    assert users == {"alice", "other_", "other"}
    assert value(s, "llmtop_user_requests_total", user="other_", outcome="ok") == 3
    assert value(s, "llmtop_user_requests_total", user="other", outcome="ok") == 3
    assert value(s, "llmtop_user_ttft_seconds_count", user="other_") == 3
    assert value(s, "llmtop_user_ttft_seconds_count", user="other") == 3
    assert value(s, "llmtop_user_in_flight", user="other_") == 0


def test_label_values_are_one_to_one() -> None:
    names = ["other", "other_", "other__", "other_x", "Other", "others", "_other", "", "a"]
    labels = [label_value(n) for n in names]
    assert labels[:3] == ["other_", "other__", "other___"]
    assert labels[3:] == names[3:]  # only other, other_, other__... change
    assert OTHER not in labels and len(set(labels)) == len(names)
    slots = LabelSlots(4, base=2, other_id=1)
    for n in ("other", "other_", "bob"):
        slots.series_for(n)
    assert sorted(slots.labels().values()) == ["bob", "other", "other_", "other__"]
    assert sorted(slots.tracked().values()) == ["bob", "other", "other", "other_"]


def test_a_heavy_user_named_other_is_promoted_out_of_the_fold() -> None:
    """With every slot taken, "other" is counted in the fold while its score grows, and
    swapped in like any newcomer (it used to be kept out: its name was the fold's)."""
    slots = LabelSlots(1, base=2, other_id=1)
    assert slots.series_for("alice") == 2
    for _ in range(5):
        assert slots.series_for("other") == 1  # counted in the fold meanwhile
    assert slots.untracked_recent() == 1
    assert slots.rebalance(0.0) == {2: 1}  # alice demoted
    assert slots.series_for("other") == 2 and slots.names[2] == "other"
    assert slots.names[1] == OTHER and slots.peek("alice") == 1


def test_merging_proxies_keeps_the_user_other_apart_from_the_folds() -> None:
    a = _agg(USERS).snapshot(None)
    b = _agg(["other", "bob", "bob", "eve", "fay"]).snapshot(None)  # eve, fay fold
    assert _rows(b)[("other", True)]["requests"] == 1
    m = merge_snapshots([a, b])
    r = _rows(m)
    assert set(r) == {("alice", True), ("bob", True), ("other", True), ("other", False)}
    assert r[("other", True)]["requests"] == 4  # 3 + 1: the user, on both proxies
    assert r[("other", False)]["requests"] == 5  # 3 + 2: the folds
    assert sum(u["requests"] for u in m["users"]) == m["system"]["requests"] == 13


def test_a_model_named_other_is_apart_from_the_model_fold() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    clock.advance(1)
    names = ["other"] + [f"m{i}" for i in range(MODEL_SLOTS + 2)]
    agg.on_events([record(model=n) for n in names] + [record(model="other")])
    models = agg.snapshot(None)["models"]
    rows = {(m["model"], m["tracked"]): m for m in models}
    assert len(rows) == len(models) == MODEL_SLOTS + 1
    assert rows[("other", True)]["requests"] == 2 and rows[("other", False)]["requests"] == 3
    s = scrape(agg)
    assert value(s, "llmtop_model_requests_total", model="other_", outcome="ok") == 2
    assert value(s, "llmtop_model_requests_total", model="other", outcome="ok") == 3
    m = merge_snapshots([agg.snapshot(None), agg.snapshot(None)])
    rows = {(r["model"], r["tracked"]): r for r in m["models"]}
    assert rows[("other", True)]["requests"] == 4 and rows[("other", False)]["requests"] == 6
