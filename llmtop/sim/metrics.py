"""``/metrics`` of the simulator in vLLM's Prometheus names, built at scrape time.

Exported (all labelled ``model_name``):

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (a 0–1 fraction, as vLLM's despite the name) and its older
  name ``vllm:gpu_cache_usage_perc``;
* counters ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason}``;
* histograms ``vllm:time_to_first_token_seconds`` (arrival → first token, vLLM's buckets)
  and ``vllm:e2e_request_latency_seconds``;
* ``llmtop_sim_info{profile,model}`` = 1, so a scraper can tell the simulator from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from llmtop.sim.engine import SimEngine

CONTENT_TYPE = CONTENT_TYPE_LATEST


class EngineCollector(Collector):
    """Reads the engine's live state on every scrape (nothing is copied per token)."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        model = e.profile.model
        labels, values = ["model_name"], [model]
        state = e.state()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        info = GaugeMetricFamily("llmtop_sim_info", "llmtop's simulated engine.",
                                 labels=["profile", "model"])
        info.add_metric([e.profile.name, model], 1)
        yield info
        yield gauge("vllm:num_requests_running",
                    "Number of requests in model execution batches.", state["running"])
        yield gauge("vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.", state["waiting"])
        yield gauge("vllm:kv_cache_usage_perc",
                    "KV-cache usage. 1 means 100 percent usage.", e.kv_usage)
        yield gauge("vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage.", e.kv_usage)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      e.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      e.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      e.generation_tokens_total)
        success = CounterMetricFamily("vllm:request_success",
                                      "Count of successfully processed requests.",
                                      labels=["model_name", "finished_reason"])
        for reason, n in e.success.items():
            success.add_metric([model, reason], n)
        yield success
        for name, doc, hist in (
            ("vllm:time_to_first_token_seconds",
             "Histogram of time to first token in seconds.", e.ttft),
            ("vllm:e2e_request_latency_seconds",
             "Histogram of end to end request latency in seconds.", e.e2e),
        ):
            h = HistogramMetricFamily(name, doc, labels=labels)
            h.add_metric(values, buckets=hist.cumulative(), sum_value=hist.total)
            yield h


def registry_for(engine: SimEngine) -> CollectorRegistry:
    """A private registry holding only the engine's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of ``registry``."""
    return generate_latest(registry)
