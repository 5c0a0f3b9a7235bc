"""A /metrics scrape parsed with prometheus_client's parser agrees with the snapshot."""

from __future__ import annotations

import time

import pytest
from metrics_records import Clock, record
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmtop.config import Config
from llmtop.events import ActiveRequest, EngineReading, GpuReading, WarningEvent
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import make_registry

EVIL = 'evil"} 1\nllmtop_fake{x="'


def scrape(agg: Aggregator) -> dict[str, list]:
    text = generate_latest(make_registry(agg)).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    hits = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return float(hits[0])


@pytest.fixture
def agg() -> Aggregator:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    a = Aggregator(Config(top_users=2), reg, clock=clock)
    ttfts = [0.03, 0.07, 0.2, 0.4, 0.6, 1.2, 2.2, 4.0]
    for i, t in enumerate(ttfts):
        clock.advance(1.0)
        a.on_events([record(user=["alice", EVIL, "carl", "dora"][i % 4], ttft=t,
                            outcome="error" if i == 7 else "ok")])
        a.tick()
    now = time.perf_counter_ns()
    reg["x"] = ActiveRequest("x", "alice", "m", "openai", "/v1", True, clock.t, now,
                             first_token_ns=now, tokens=3)
    a.on_events([
        GpuReading(clock.t, 0, "H200", 5 * 2**30, 141 * 2**30, util_gpu=55.0, power_w=None),
        EngineReading(clock.t, "vllm", running=4.0, waiting=1.0, kv_cache_usage=0.3),
        WarningEvent(clock.t, "QUEUEING", "warning", "queue", "raised"),
        WarningEvent(clock.t, "KV_CACHE", "warning", "kv", "raised"),
        WarningEvent(clock.t, "KV_CACHE", "warning", "kv", "cleared"),
    ])
    return a


def test_counters_and_histograms_agree_with_the_snapshot(agg: Aggregator) -> None:
    s = scrape(agg)
    snap = agg.snapshot(None)
    assert value(s, "llmtop_requests_total", outcome="ok") == 7
    assert value(s, "llmtop_requests_total", outcome="error") == 1
    # tokens of finished requests; the snapshot's output_tokens are the tokens streamed,
    # the open stream's 3 too (counted up to the snapshot since the window is from start)
    sy = snap["system"]
    assert value(s, "llmtop_output_tokens_total") == sy["output_tokens"] - 3 == \
        pytest.approx(sy["finished_output_tps"] * sy["span_s"])
    assert value(s, "llmtop_ttft_seconds_count") == snap["latency"]["ttft"]["count"] == 8
    assert value(s, "llmtop_ttft_seconds_bucket", le="+Inf") == 8
    assert value(s, "llmtop_ttft_seconds_bucket", le="0.05") == 1
    assert value(s, "llmtop_ttft_seconds_bucket", le="0.5") == 4
    assert value(s, "llmtop_ttft_seconds_bucket", le="5.0") == 8
    assert value(s, "llmtop_ttft_seconds_sum") == pytest.approx(sum(
        [0.03, 0.07, 0.2, 0.4, 0.6, 1.2, 2.2, 4.0]), rel=1e-3)
    buckets = [x.value for x in s["llmtop_itl_seconds_bucket"]]
    assert buckets == sorted(buckets) and buckets[-1] == snap["latency"]["itl"]["count"]
    assert value(s, "llmtop_in_flight") == 1 and value(s, "llmtop_streaming") == 1
    assert value(s, "llmtop_slo_attainment", window="60") == pytest.approx(
        agg.snapshot(60)["system"]["slo_attainment"])


def test_attainment_counters_leave_out_cancels_on_track() -> None:
    """slo_met ÷ slo_judged is the attainment the snapshot shows: a request cancelled
    while within every objective is in requests_total but not in slo_judged."""
    clock = Clock()
    a = Aggregator(Config(), {}, clock=clock)
    clock.advance(1.0)
    a.on_events([record(), record(outcome="cancelled"), record(outcome="error"),
                 record(outcome="cancelled", ttft=2.0)])  # the last gave up on a slow TTFT
    a.tick()
    s = scrape(a)
    snap = a.snapshot(60)["system"]
    assert value(s, "llmtop_requests_total", outcome="cancelled") == 2
    assert value(s, "llmtop_slo_met_requests_total") == snap["slo_met"] == 1
    assert value(s, "llmtop_slo_judged_requests_total") == snap["slo_judged"] == 3
    assert value(s, "llmtop_slo_attainment", window="60") == pytest.approx(1 / 3)
    assert snap["slo_attainment"] == pytest.approx(1 / 3)


def test_user_labels_are_bounded_and_escaped(agg: Aggregator) -> None:
    s = scrape(agg)
    users = {x.labels["user"] for x in s["llmtop_user_requests_total"]}
    assert users == {"alice", EVIL, "other"}  # top 2 + other: carl and dora folded
    assert value(s, "llmtop_user_requests_total", user=EVIL, outcome="ok") == 2
    assert value(s, "llmtop_user_in_flight", user="alice") == 1
    assert "llmtop_fake" not in s  # the label value stayed a value
    assert value(s, "llmtop_user_ttft_seconds_count", user="other") == 4


def test_readings_and_warning_gauges(agg: Aggregator) -> None:
    s = scrape(agg)
    assert value(s, "llmtop_gpu_utilization_percent", gpu="0") == 55.0
    assert "llmtop_gpu_power_watts" not in s  # unavailable: absent, not 0
    assert value(s, "llmtop_engine_running", kind="vllm") == 4.0
    assert value(s, "llmtop_warning_active", code="QUEUEING") == 1
    assert value(s, "llmtop_warning_active", code="KV_CACHE") == 0


def test_capacity_gauges_appear_once_estimated() -> None:
    clock = Clock()
    a = Aggregator(Config(), clock=clock)
    assert "llmtop_capacity_max_concurrency_at_slo" not in scrape(a)
    clock.advance(1)
    a.on_events([record(concurrency=3) for _ in range(25)])
    assert value(scrape(a), "llmtop_capacity_max_concurrency_at_slo") == 3


def test_the_global_registry_is_left_alone(agg: Aggregator) -> None:
    make_registry(agg)
    names = {m.name for m in REGISTRY.collect()}
    assert not any(n.startswith("llmtop") for n in names)
