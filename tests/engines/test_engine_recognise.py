"""Recognising engines from exposition fixtures (tests/fixtures/engines/).

vLLM, SGLang, TGI and "unknown" fixtures are written by hand from each engine's documented
metric names (each file says so in its header); llamacpp_metrics.txt is the real capture
from llama.cpp's server (copied from shared/fixtures/llamacpp/metrics.txt).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmtop.engines import engine_ttft_quantile, recognise
from llmtop.engines.recognise import RAW_LIMIT, parse_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_vllm_v1_two_engines_summed_and_max() -> None:
    """Counts summed over label sets (engine 0 + 1), KV fraction is the max."""
    r = recognise(fixture("vllm_v1_metrics.txt"), 12.5)
    assert r.t == 12.5 and r.kind == "vllm"
    assert r.running == 21.0
    assert r.waiting == 3.0
    assert r.kv_cache_usage == 0.8125
    assert r.preemptions == 7.0
    buckets = dict(r.ttft_buckets)
    assert buckets[0.02] == 5.0 and buckets[0.1] == 240.0 and buckets[math.inf] == 350.0
    assert [le for le, _ in r.ttft_buckets] == sorted(le for le, _ in r.ttft_buckets)
    # engine's own names first in raw, buckets and _created left out, _sum/_count kept
    first = next(iter(r.raw))
    assert first.startswith("vllm:num_requests_running{")
    assert not any(k.split("{")[0].endswith(("_bucket", "_created")) for k in r.raw)
    key = (
        "vllm:time_to_first_token_seconds_count"
        '{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    )
    assert r.raw[key] == 200.0
    assert r.raw['python_gc_objects_collected_total{generation="1"}'] == 678.0


def test_vllm_v1_engine_ttft_p95() -> None:
    """histogram_quantile over the summed buckets: rank 332.5 of 350 lies in (0.25, 0.5]
    holding 320 → 343, so p95 = 0.25 + 0.25 × (332.5 − 320) / 23."""
    r = recognise(fixture("vllm_v1_metrics.txt"), 0.0)
    p95 = engine_ttft_quantile(r.ttft_buckets, 0.95)
    assert p95 == pytest.approx(0.25 + 0.25 * 12.5 / 23)


def test_vllm_v0_older_kv_name() -> None:
    r = recognise(fixture("vllm_v0_metrics.txt"), 0.0)
    assert r.kind == "vllm"
    assert (r.running, r.waiting, r.kv_cache_usage, r.preemptions) == (4.0, 1.0, 0.25, 0.0)
    assert r.ttft_buckets == ()
    assert not any("_created" in k for k in r.raw)


def test_sglang() -> None:
    r = recognise(fixture("sglang_metrics.txt"), 0.0)
    assert r.kind == "sglang"
    assert (r.running, r.waiting, r.kv_cache_usage) == (48.0, 17.0, 0.63)
    assert r.preemptions is None
    assert dict(r.ttft_buckets)[math.inf] == 1000.0
    assert engine_ttft_quantile(r.ttft_buckets, 0.5) == pytest.approx(0.1 + 0.4 * 400 / 500)


def test_tgi() -> None:
    r = recognise(fixture("tgi_metrics.txt"), 0.0)
    assert r.kind == "tgi"
    assert (r.running, r.waiting) == (32.0, 6.0)
    assert r.kv_cache_usage is None and r.ttft_buckets == ()
    assert r.raw['tgi_request_queue_duration{quantile="0.99"}'] == 0.4567
    assert r.raw["tgi_request_count"] == 1520.0


def test_llamacpp_real_capture() -> None:
    """The real llama.cpp capture has no kv_cache_usage_ratio → None; counters keep the
    names the server wrote (the parser would add _total to llamacpp:n_tokens_max)."""
    r = recognise(fixture("llamacpp_metrics.txt"), 0.0)
    assert r.kind == "llamacpp"
    assert (r.running, r.waiting) == (0.0, 0.0)
    assert r.kv_cache_usage is None
    assert r.raw["llamacpp:n_tokens_max"] == 47.0
    assert "llamacpp:n_tokens_max_total" not in r.raw
    assert r.raw["llamacpp:prompt_tokens_total"] == 41.0
    assert len(r.raw) == 15


def test_llamacpp_with_kv_ratio() -> None:
    text = fixture("llamacpp_metrics.txt") + (
        "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
        "llamacpp:kv_cache_usage_ratio 0.42\n"
        "# TYPE llamacpp:requests_processing_b gauge\n"
    )
    assert recognise(text, 0.0).kv_cache_usage == 0.42


def test_unknown_keeps_raw_finite_values() -> None:
    r = recognise(fixture("unknown_metrics.txt"), 3.0)
    assert r.kind == "unknown"
    assert (r.running, r.waiting, r.kv_cache_usage, r.preemptions) == (None,) * 4
    assert r.raw == {
        'http_requests_total{code="200",path="/v1/chat/completions"}': 1027.0,
        'http_requests_total{code="500",path="/v1/chat/completions"}': 3.0,
        "inflight": 4.0,
        "latency_seconds_count": 5.0,
        "latency_seconds_sum": 0.9,
    }


def test_raw_is_bounded() -> None:
    text = "".join(f"m_{i} {i}\n" for i in range(RAW_LIMIT + 50))
    r = recognise(text, 0.0)
    assert len(r.raw) == RAW_LIMIT
    assert r.raw["m_0"] == 0.0 and f"m_{RAW_LIMIT}" not in r.raw


def test_sim_marker() -> None:
    text = fixture("vllm_v0_metrics.txt") + 'llmtop_sim_info{profile="tiny"} 1\n'
    r = recognise(text, 0.0)
    assert r.kind == "sim" and r.running == 4.0


def test_engine_with_most_names_wins() -> None:
    """A foreign metric or two (a sidecar's) does not change the engine's kind."""
    text = fixture("sglang_metrics.txt") + "tgi_queue_size 99\n"
    assert recognise(text, 0.0).kind == "sglang"


@pytest.mark.parametrize("text", ["<html><body>Not Found</body></html>", "hello world", "{}"])
def test_not_exposition_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        recognise(text, 0.0)


def test_empty_text_is_unknown() -> None:
    r = recognise("", 0.0)
    assert r.kind == "unknown" and r.raw == {}


def test_reading_round_trips_through_json_dict() -> None:
    """The reading survives the recording's JSON shape (finite raw values only)."""
    from llmtop.events import EngineReading

    r = recognise(fixture("vllm_v1_metrics.txt"), 1.0)
    back = EngineReading.from_json_dict(r.to_json_dict())
    assert back == r
    assert all(math.isfinite(v) for v in r.raw.values())


def test_parse_samples_restores_written_counter_names() -> None:
    s = parse_samples("# TYPE a counter\na 3\n# TYPE b counter\nb_total 4\n")
    assert set(s.by_name) == {"a", "b_total"}


def test_only_ttft_buckets_are_parsed() -> None:
    """Buckets of other histograms are skipped before parsing (the parser's cost is per
    sample); their _sum and _count stay."""
    from llmtop.engines.recognise import TTFT_HISTOGRAMS

    s = parse_samples(fixture("vllm_v1_metrics.txt"), TTFT_HISTOGRAMS)
    assert "vllm:time_to_first_token_seconds_bucket" in s.by_name
    assert "vllm:e2e_request_latency_seconds_bucket" not in s.by_name
    assert "vllm:e2e_request_latency_seconds_count" in s.by_name
    everything = parse_samples(fixture("vllm_v1_metrics.txt"))
    assert "vllm:e2e_request_latency_seconds_bucket" in everything.by_name
