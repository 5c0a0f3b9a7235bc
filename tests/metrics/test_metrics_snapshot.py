"""The snapshot JSON: the documented shape, live figures from the registry, readings."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from interfaces_example import SNAPSHOT_EXAMPLE
from metrics_records import T0, Clock, record

from llmtop.config import Config
from llmtop.events import ActiveRequest, EngineReading, GpuReading, WarningEvent
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.hdr import decode_sparse
from llmtop.metrics.snapshot import bucket_quantile

DOCUMENTED = SNAPSHOT_EXAMPLE


def is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def check_shape(doc: Any, ours: Any, path: str = "$") -> None:
    """Every documented key is present, with the documented type (null: number or null)."""
    if isinstance(doc, dict):
        assert isinstance(ours, dict), path
        for k, v in doc.items():
            assert k in ours, f"{path}.{k} missing"
            check_shape(v, ours[k], f"{path}.{k}")
    elif isinstance(doc, list):
        assert isinstance(ours, list), path
        assert ours, f"{path} is empty (the test feeds data for it)"
        for item in ours:
            check_shape(doc[0], item, f"{path}[]")
    elif doc is None:
        assert ours is None or is_num(ours), path
    elif isinstance(doc, bool):
        assert isinstance(ours, bool), path
    elif isinstance(doc, int):
        assert isinstance(ours, int) and not isinstance(ours, bool), path
    elif isinstance(doc, float):
        assert is_num(ours), path
    elif isinstance(doc, str):
        assert isinstance(ours, str), path


def active(rid: str, user: str, *, first: bool, tokens: int = 0) -> ActiveRequest:
    now = time.perf_counter_ns()
    return ActiveRequest(rid, user, "m", "openai", "/v1/chat/completions", True, T0,
                         now - 10**9, first_token_ns=now if first else None, tokens=tokens)


@pytest.fixture
def busy() -> tuple[Aggregator, Clock, dict[str, ActiveRequest]]:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock, upstream="http://engine:8000")
    for i in range(20):
        clock.advance(0.5)
        agg.on_events([record(user="alice" if i % 2 else "bob", ttft=0.1 + i / 100)])
        agg.tick()
    agg.on_events([
        GpuReading(clock.t, 0, "NVIDIA H200", 10 * 2**30, 141 * 2**30, util_gpu=40.0,
                   mem_busy=float("nan"), dram_bw_util=None, power_w=300.0),
        EngineReading(clock.t - 30, "vllm", 1, 0, 0.1,
                      ttft_buckets=((0.1, 10.0), (0.5, 10.0), (float("inf"), 10.0))),
        EngineReading(clock.t, "vllm", 3.0, 2.0, 0.5, preemptions=1.0,
                      ttft_buckets=((0.1, 10.0), (0.5, 30.0), (float("inf"), 30.0))),
        WarningEvent(clock.t, "QUEUEING", "warning", "requests wait for the engine", "raised"),
    ])
    reg["a1"] = active("a1", "alice", first=True, tokens=5)
    reg["a2"] = active("a2", "carol", first=False)
    reg["a3"] = active("a3", "alice", first=False)
    return agg, clock, reg


@pytest.mark.parametrize("window", [10, 60, 300, None])
def test_every_documented_key_is_present_with_its_type(busy: Any, window: int | None) -> None:
    agg, _, _ = busy
    snap = agg.snapshot(window)
    check_shape({**DOCUMENTED, "window_s": None if window is None else 60}, snap)
    assert snap["version"] == 1 and snap["window_s"] == window  # "all" is null
    for name in ("ttft", "itl", "chunk_gap", "tpot", "e2e"):
        check_shape(DOCUMENTED["latency"]["ttft"], snap["latency"][name], f"latency.{name}")
    text = json.dumps(snap, allow_nan=False)  # strict JSON: no NaN/inf anywhere
    assert json.loads(text)["system"]["requests"] == snap["system"]["requests"]


def test_histograms_decode_to_the_latency_counts(busy: Any) -> None:
    agg, _, _ = busy
    snap = agg.snapshot(None)
    for name, text in snap["histograms"].items():
        _, counts = decode_sparse(text)
        assert int(counts.sum()) == snap["latency"][name]["count"], name
    assert snap["latency"]["ttft"]["count"] == 20
    assert snap["latency"]["itl"]["count"] == 20 * 9


def test_live_figures_come_from_the_registry(busy: Any) -> None:
    agg, _, reg = busy
    snap = agg.snapshot(60)
    s = snap["system"]
    assert (s["in_flight"], s["waiting"], s["streaming"]) == (3, 2, 1)
    users = {u["user"]: u for u in snap["users"]}
    assert users["alice"]["in_flight"] == 2 and users["alice"]["waiting"] == 1
    assert users["carol"]["in_flight"] == 1 and users["carol"]["requests"] == 0
    reg.clear()
    assert agg.snapshot(60)["system"]["in_flight"] == 0


def test_readings_and_warnings(busy: Any) -> None:
    agg, clock, _ = busy
    snap = agg.snapshot(10)
    g = snap["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["util_gpu"] == 40.0
    assert g["mem_busy"] is None  # NaN reading → null
    e = snap["engine"]
    assert (e["kind"], e["running"], e["waiting"], e["kv_cache_usage"]) == ("vllm", 3.0, 2.0, 0.5)
    # the window's own TTFT distribution: 20 new requests, all between 0.1 and 0.5 s
    assert agg.snapshot(60)["engine"]["ttft_p95"] == pytest.approx(0.1 + 0.4 * 19 / 20)
    assert snap["warnings"][0]["code"] == "QUEUEING"
    agg.on_events([WarningEvent(clock.t + 1, "QUEUEING", "warning", "", "cleared")])
    assert agg.snapshot(10)["warnings"] == []


def test_engine_absent_is_all_null() -> None:
    snap = Aggregator(Config()).snapshot(60)
    assert snap["engine"]["kind"] is None and snap["engine"]["running"] is None
    assert snap["gpus"] == [] and snap["users"] == []
    assert snap["system"]["slo_attainment"] is None
    assert snap["latency"]["ttft"]["p95"] is None
    check_shape(DOCUMENTED["system"], snap["system"])


def test_live_tokens_are_attributed_as_they_stream_and_not_counted_twice() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    a = active("r1", "alice", first=True, tokens=0)
    reg["r1"] = a
    agg.tick()
    for _ in range(5):
        clock.advance(1.0)
        a.tokens += 50
        agg.tick()
    mid = agg.snapshot(60)
    assert mid["system"]["output_tokens"] == 250
    assert mid["system"]["requests"] == 0
    assert {u["user"]: u for u in mid["users"]}["alice"]["output_tokens"] == 250
    del reg["r1"]
    clock.advance(0.2)
    agg.on_events([record(rid="r1", user="alice", completion_tokens=260,
                          tokens=[26] * 10)])
    end = agg.snapshot(60)
    assert end["system"]["output_tokens"] == 260  # the engine's final count wins
    assert end["system"]["requests"] == 1


def test_series_points_cover_recent_intervals(busy: Any) -> None:
    agg, clock, _ = busy
    clock.advance(4.0)
    agg.tick()
    series = agg.snapshot(60)["series"]
    assert len(series) >= 5
    assert all(p["t"] % 2 == 0 for p in series)
    assert sum(p["requests"] for p in series) == 20
    busy_points = [p for p in series if p["requests"]]
    assert all(p["ttft_p95"] is not None and p["rps"] > 0 for p in busy_points)


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        Aggregator(Config()).snapshot(30)


def test_recent_requests_keep_the_recording_shape(busy: Any) -> None:
    agg, _, _ = busy
    recent = agg.recent_requests(5)
    assert len(recent) == 5 and all(r["type"] == "request" for r in recent)
    assert recent[-1]["user"] == "alice"


def test_bucket_quantile_is_promql_like() -> None:
    b = [(0.1, 10.0), (0.5, 30.0), (float("inf"), 30.0)]
    assert bucket_quantile(b, 0.5) == pytest.approx(0.1 + 0.4 * 5 / 20)
    assert bucket_quantile([(0.1, 0.0), (float("inf"), 5.0)], 0.5) == 0.1
    assert bucket_quantile([], 0.5) is None
