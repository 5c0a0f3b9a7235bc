"""Merged snapshots of several proxies equal one aggregator that saw all the traffic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.events import GpuReading, WarningEvent
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.hdr import decode_sparse
from llmtop.metrics.merge import merge_snapshots

traffic = st.lists(
    st.tuples(
        st.floats(0, 40),  # seconds since the previous request
        st.sampled_from(["alice", "bob", "carol", "dave"]),
        st.one_of(st.none(), st.floats(0.001, 3.0)),  # TTFT
        st.lists(st.floats(0.0, 0.2), max_size=12),  # chunk gaps
        st.sampled_from(["ok", "ok", "ok", "error", "cancelled", "timeout"]),
        st.integers(1, 6),  # concurrency at start
        st.integers(0, 2),  # which proxy saw it
    ),
    min_size=1,
    max_size=40,
)


def approx_equal(a: Any, b: Any, path: str = "$") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) <= set(b), path
        for k in a:
            approx_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


@settings(max_examples=40, deadline=None)
@given(traffic, st.sampled_from([10, 60, 300, None]))
def test_merged_equals_one_proxy_seeing_everything(rows: list, window: int | None) -> None:
    clock = Clock()
    parts = [Aggregator(Config(), clock=clock) for _ in range(3)]
    whole = Aggregator(Config(), clock=clock)
    for dt, user, ttft, gaps, outcome, conc, which in rows:
        clock.advance(dt)
        r = record(user=user, ttft=ttft, gaps=gaps if ttft is not None else [],
                   outcome=outcome, concurrency=conc)
        for agg in (parts[which], whole):
            agg.on_events([r])
        for agg in (*parts, whole):
            agg.tick()
    merged = merge_snapshots([p.snapshot(window, user_histograms=True) for p in parts])
    one = whole.snapshot(window, user_histograms=True)

    assert merged["window_s"] == one["window_s"]
    approx_equal(one["latency"], merged["latency"])
    for name, text in one["histograms"].items():
        a, b = decode_sparse(text), decode_sparse(merged["histograms"][name])
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist(), name
    for k in ("requests", "errors", "cancelled", "timeouts", "slo_met", "rps", "output_tps",
              "input_tps", "goodput_rps", "goodput_tps", "slo_attainment", "slo_judged"):
        approx_equal(one["system"][k], merged["system"][k], k)
    users_one = {u["user"]: u for u in one["users"]}
    users_merged = {u["user"]: u for u in merged["users"]}
    assert set(users_one) == set(users_merged)
    for name, u in users_one.items():
        m = users_merged[name]
        for k in ("requests", "errors", "slo_met", "slo_judged", "slo_attainment", "output_tps",
                  "ttft_p50",
                  "ttft_p95", "ttft_p99", "itl_p50", "itl_p95", "itl_p99", "tpot_p95",
                  "e2e_p95"):
            approx_equal(u[k], m[k], f"users.{name}.{k}")
        assert not m.get("approximate")
    approx_equal({k: v for k, v in one["capacity"].items() if k != "bins"},
                 merged["capacity"])
    assert len(one["capacity"]["bins"]) == len(merged["capacity"]["bins"])
    for a, b in zip(one["capacity"]["bins"], merged["capacity"]["bins"], strict=True):
        approx_equal(a, b)
    by_t = {p["t"]: p for p in merged["series"]}
    for p in one["series"]:
        assert by_t[p["t"]]["requests"] == p["requests"]


def test_readings_and_warnings_merge_by_identity() -> None:
    clock = Clock()
    a, b = Aggregator(Config(), clock=clock), Aggregator(Config(), clock=clock)
    a.host = b.host = "node1"
    a.on_events([GpuReading(clock.t - 1, 0, "H200", 1, 2),
                 WarningEvent(clock.t - 5, "QUEUEING", "warning", "a", "raised")])
    b.on_events([GpuReading(clock.t, 0, "H200", 3, 2), GpuReading(clock.t, 1, "H200", 4, 2),
                 WarningEvent(clock.t - 9, "QUEUEING", "critical", "b", "raised"),
                 WarningEvent(clock.t, "KV_CACHE", "warning", "kv", "raised")])
    m = merge_snapshots([a.snapshot(60), b.snapshot(60)])
    assert [(g["index"], g["mem_used_bytes"]) for g in m["gpus"]] == [(0, 3), (1, 4)]
    w = {x["code"]: x for x in m["warnings"]}
    assert w["QUEUEING"]["severity"] == "critical" and w["QUEUEING"]["since"] == clock.t - 9
    assert set(w) == {"QUEUEING", "KV_CACHE"}
    a.host = "node2"
    assert len(merge_snapshots([a.snapshot(60), b.snapshot(60)])["gpus"]) == 3


def test_users_without_histograms_merge_as_upper_bounds() -> None:
    clock = Clock()
    a, b = Aggregator(Config(), clock=clock), Aggregator(Config(), clock=clock)
    clock.advance(1)
    a.on_events([record(user="x", ttft=0.1)])
    b.on_events([record(user="x", ttft=0.9)])
    m = merge_snapshots([a.snapshot(60), b.snapshot(60)])
    [x] = m["users"]
    assert x["requests"] == 2 and x["approximate"] is True
    assert x["ttft_p95"] == pytest.approx(b.snapshot(60)["users"][0]["ttft_p95"])


def test_folded_user_counts_add_up_as_an_upper_bound() -> None:
    clock = Clock()
    a, b = (Aggregator(Config(top_users=1), clock=clock) for _ in range(2))
    clock.advance(1)
    a.on_events([record(user=u) for u in ("x", "y", "z")])
    b.on_events([record(user=u) for u in ("x", "y")])
    sa, sb = a.snapshot(60), b.snapshot(60)
    assert (sa["users_untracked"], sb["users_untracked"]) == (2, 1)
    assert merge_snapshots([sa, sb])["users_untracked"] == 3  # y counted on both
    del sa["users_untracked"]  # an older proxy does not say
    assert merge_snapshots([sa, sb])["users_untracked"] == 1


def test_refuses_what_cannot_be_merged() -> None:
    agg = Aggregator(Config())
    with pytest.raises(ValueError, match="no snapshots"):
        merge_snapshots([])
    with pytest.raises(ValueError, match="windows"):
        merge_snapshots([agg.snapshot(10), agg.snapshot(60)])
    bad = agg.snapshot(60)
    bad["histograms"]["ttft"] = "garbage!"
    with pytest.raises(ValueError):
        merge_snapshots([bad, agg.snapshot(60)])


def test_a_snapshot_without_slo_judged_judges_all_its_requests() -> None:
    """An older llmtop sends no ``slo_judged``: its requests all count in attainment."""
    new = {"system": {"requests": 10, "slo_met": 8, "slo_judged": 8},
           "users": [{"user": "a", "requests": 10, "slo_met": 8, "slo_judged": 8}]}
    old = {"system": {"requests": 10, "slo_met": 5},
           "users": [{"user": "a", "requests": 10, "slo_met": 5}]}
    merged = merge_snapshots([new, old])
    assert merged["system"]["slo_judged"] == 18
    assert merged["system"]["slo_attainment"] == pytest.approx(13 / 18)
    (user,) = merged["users"]
    assert user["slo_judged"] == 18 and user["slo_attainment"] == pytest.approx(13 / 18)


def test_a_snapshot_without_slo_met_counts_its_attainment() -> None:
    """A proxy that sends only the interface's ``slo_attainment`` (no ``slo_met``) met
    that share of its requests; it was merged as 0 met ("SLO 0%" for 41 % and 100 %)."""
    a = {"system": {"requests": 100, "slo_attainment": 0.41},
         "users": [{"user": "u", "requests": 100, "slo_attainment": 0.41}]}
    b = {"system": {"requests": 50, "slo_attainment": 1.0},
         "users": [{"user": "u", "requests": 50, "slo_attainment": 1.0}]}
    c = {"system": {"requests": 20, "slo_met": 10, "slo_judged": 20},
         "users": [{"user": "u", "requests": 20, "slo_met": 10, "slo_judged": 20}]}
    for parts, met, judged in (([a, b], 91, 150), ([a, b, c], 101, 170)):
        merged = merge_snapshots(parts)
        assert merged["system"]["slo_met"] == met
        assert merged["system"]["slo_attainment"] == pytest.approx(met / judged)
        (user,) = merged["users"]
        assert user["slo_met"] == met and user["slo_attainment"] == pytest.approx(met / judged)
    nothing = {"system": {"requests": 5}, "users": [{"user": "u", "requests": 5}]}
    assert merge_snapshots([nothing, c])["system"]["slo_attainment"] == pytest.approx(10 / 25)


def test_every_proxys_recording_is_named() -> None:
    """QA: `attach A B` with both recording showed only A's file."""
    agg = Aggregator(Config(), clock=Clock())
    a, b, c = agg.snapshot(60), agg.snapshot(60), agg.snapshot(60)
    a["recording"] = {"path": "/r/a.jsonl", "recording": True, "requests": 3}
    b["recording"] = {"path": "/r/b.jsonl", "recording": True, "requests": 4}
    c["recording"] = None
    m = merge_snapshots([a, b, c])["recording"]
    assert m["path"] == "/r/a.jsonl (+1 more)" and m["paths"] == ["/r/a.jsonl", "/r/b.jsonl"]
    assert merge_snapshots([c, a])["recording"] == a["recording"]  # one: as it is
    assert merge_snapshots([c, c])["recording"] is None
    assert m["error"] is None and m["others_writing"] == []


def test_a_failed_or_shared_recording_on_any_proxy_is_the_merged_ones() -> None:
    """The merged status was the first proxy's: B's recording stopped writing (a full
    disk) and attach still showed a plain REC; B sharing its stem with another live
    process was not said either."""
    agg = Aggregator(Config(), clock=Clock())
    a, b = agg.snapshot(60), agg.snapshot(60)
    a["recording"] = {"path": "/r/a.jsonl", "recording": True, "error": None}
    b["recording"] = {"path": "/r/b.jsonl", "recording": True,
                      "error": "write failed: No space left on device",
                      "others_writing": ["/r/b.20261207T010000Z.jsonl"]}
    m = merge_snapshots([a, b])["recording"]
    assert m["error"] == "/r/b.jsonl: write failed: No space left on device"
    assert m["others_writing"] == ["/r/b.20261207T010000Z.jsonl"]
    assert m["path"] == "/r/a.jsonl (+1 more)"
