"""The directly written ``/metrics`` exposition (:mod:`llmtop.metrics.promtext`) is
prometheus_client's, byte for byte, for every format and escaping ``choose_encoder``
picks (under ``dots`` and ``values``, its ``underscores`` bytes: those schemes leave
legacy names unchanged, which prometheus_client's encoders did not), on a rich aggregator
(hostile label values, every family populated, a user named ``other``, idle users) and on
edge values (exponents, ±Inf, NaN, -0.0, counts past 10⁶, a histogram label sorting
before ``le``). The families prometheus_client reads (:func:`to_metrics`) are the ones its
own ``add_metric`` builds."""

from __future__ import annotations

import math

import pytest
from metrics_records import Clock, record
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from llmtop.config import Config
from llmtop.events import EngineReading, GpuReading, WarningEvent
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import LlmtopCollector, make_registry
from llmtop.metrics.promtext import Family, Histograms, encode, render, to_metrics

ACCEPTS = [
    "",
    "*/*",
    "text/plain",
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=underscores",
    "text/plain;version=1.0.0;escaping=dots",
    "text/plain;version=1.0.0;escaping=values",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=underscores",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=2.0.0;escaping=allow-utf-8",
    # what Prometheus 3 sends
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
    "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
]

HOSTILE = ['a"b', "back\\slash", "new\nline", 'x"} 1\nllmtop_fake 1\n#', "é" * 20,
           "bad\udcff", "other", "other_", "{brace}", "le", "", "日本語"]


def rich_agg() -> Aggregator:
    clock = Clock()
    a = Aggregator(Config(top_users=len(HOSTILE) + 2), {}, clock=clock)
    for i in range(40):
        clock.advance(1)
        a.on_events([
            record(user=HOSTILE[i % len(HOSTILE)], model=["m", 'q"\\', "other"][i % 3],
                   ttft=0.001 * (i + 1) ** 2, gaps=(0.0004 * (i % 7 + 1),) * (i % 5 + 1),
                   outcome=["ok", "ok", "error", "cancelled", "timeout"][i % 5],
                   concurrency=i % 4 + 1, completion_tokens=10**7 if i == 3 else None),
        ])
        a.tick()
    a.on_events([
        GpuReading(clock.t, 0, "H200", 5 * 2**30, 141 * 2**30, util_gpu=55.0, mem_busy=20.0,
                   power_w=300.5, temperature_c=60.0, dram_bw_util=30.0),
        GpuReading(clock.t, 1, 'G"\\\n', 2**40, 2**41, util_gpu=0.0, power_w=float("nan")),
        EngineReading(clock.t, "vllm", running=4.0, waiting=1.0, kv_cache_usage=0.3,
                      preemptions=2e7),
        WarningEvent(clock.t, "QUEUEING", "warning", "queue", "raised"),
    ])
    clock.advance(0.123456789)
    return a


def same_names(accept: str) -> str:
    """``accept`` with the ``dots`` and ``values`` escapings read as ``underscores``: for
    legacy names (every llmtop name) every scheme writes the names unchanged
    (prometheus/common's ``EscapeMetricFamily``); prometheus_client escaped each sample
    name whole, suffix included, so its ``dots`` and ``values`` answers did not parse."""
    return accept.replace("escaping=dots", "escaping=underscores").replace(
        "escaping=values", "escaping=underscores")


def reference(families: list[Family], accept: str) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept)

    class Ready:
        def collect(self) -> list[object]:
            return to_metrics(families)  # type: ignore[return-value]

    return encoder(Ready()), content_type  # type: ignore[arg-type]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_exposition_is_prometheus_clients_for_a_rich_state(accept: str) -> None:
    agg = rich_agg()
    body, content_type = LlmtopCollector(agg).exposition(accept)
    assert content_type == choose_encoder(accept)[1]
    assert body == choose_encoder(same_names(accept))[0](make_registry(agg))
    text = body.decode()
    assert 'user="a\\"b"' in text and 'user="new\\nline"' in text
    assert "\udcff" not in text and 'user="bad\ufffd"' in text
    if "openmetrics" in content_type:
        assert text.endswith("# EOF\n")
        names = {f.name for f in om_parser.text_string_to_metric_families(text)}
        assert {"llmtop_requests", "llmtop_user_ttft_seconds"} <= names
    else:
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        users = {s.labels["user"] for s in fams["llmtop_user_ttft_seconds"].samples}
        assert {'a"b', "new\nline", "bad\ufffd", "other_", "日本語"} <= users


def test_idle_aggregator_and_sparse_histograms() -> None:
    a = Aggregator(Config(top_users=3), {}, clock=Clock())
    for accept in ACCEPTS[:1] + ACCEPTS[8:9]:
        body, _ = LlmtopCollector(a).exposition(accept)
        assert body == choose_encoder(accept)[0](make_registry(a))


def synthetic() -> list[Family]:
    vals = [0.0, -0.0, 1.0, -1.5, 1234567.0, 12345678.9, 1e16, 1e-7, 0.1 + 0.2,
            math.inf, -math.inf, math.nan, 2.0**53 + 2, 123456.0]
    return [
        Family("c", "counter", 'doc "quoted" \\ and\nnewline', rows=[((), 3.0)]),
        Family("g", "gauge", "g", ("zeta", "alpha", "mid"),
               rows=[((f"z{i}", 'a"\\\n', "m"), v) for i, v in enumerate(vals)]),
        Family("h_sys", "histogram", "h", hist=Histograms(
            None, [], ("0.5", "1.0"), [[0, 10**6], [3, 10**7 + 1]], [10**6 + 5, 2**60],
            [1234567.5, -0.0])),
        Family("h_a", "histogram", "h", ("a",), hist=Histograms(
            "a", ["x", 'y"'], ("0.5", "1.0"), [[1, 2], [0, 0]], [3, 0], [1.5, 0.0])),
        Family("h_z", "histogram", "h", ("z",), hist=Histograms(
            "z", ["x"], ("0.005", "300.0"), [[1, 2]], [3], [math.inf])),
        Family("empty", "gauge", "nothing yet", ("user",)),
        Family("bad:name", "gauge", "a name with a colon", rows=[((), 1.0)]),
    ]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_edge_values_and_label_orders(accept: str) -> None:
    fams = synthetic()
    assert encode(fams, accept) == reference(fams, accept)
    legacy = fams[:-1]  # without the colon: the direct path, for every escaping
    body, content_type = encode(legacy, accept)
    assert content_type == reference(legacy, accept)[1]
    assert body == reference(legacy, same_names(accept))[0]


def test_to_metrics_builds_what_add_metric_builds() -> None:
    fams = synthetic()
    got = to_metrics(fams)
    c = CounterMetricFamily("c", fams[0].doc)
    c.add_metric([], 3.0)
    g = GaugeMetricFamily("g", "g", labels=["zeta", "alpha", "mid"])
    for values, v in fams[1].rows:
        g.add_metric(list(values), v)
    h = HistogramMetricFamily("h_a", "h", labels=["a"])
    h.add_metric(["x"], [("0.5", 1.0), ("1.0", 2.0), ("+Inf", 3.0)], 1.5)
    h.add_metric(['y"'], [("0.5", 0.0), ("1.0", 0.0), ("+Inf", 0.0)], 0.0)
    for ref, mine in ((c, got[0]), (g, got[1]), (h, got[3])):
        assert (mine.name, mine.type, mine.documentation) == (ref.name, ref.type,
                                                              ref.documentation)
        assert [(s.name, s.labels, repr(s.value)) for s in mine.samples] == [
            (s.name, s.labels, repr(s.value)) for s in ref.samples]


def test_the_registry_path_and_the_direct_path_agree_through_a_registry() -> None:
    """``make_registry`` (what tests and other callers encode with prometheus_client)
    and ``exposition`` read the same aggregator the same way."""
    agg = rich_agg()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LlmtopCollector(agg))
    for accept in ("", "application/openmetrics-text"):
        assert LlmtopCollector(agg).exposition(accept)[0] == choose_encoder(accept)[0](reg)


def test_the_direct_writer_is_what_answers_the_usual_formats() -> None:
    """Not the fallback: ``render`` itself gives prometheus_client's bytes."""
    fams = LlmtopCollector(rich_agg()).families()
    assert render(fams, "text").encode() == reference(fams, "")[0]
    om = "application/openmetrics-text"
    assert render(fams, "openmetrics").encode() == reference(fams, om)[0]
    legacy = synthetic()[:-1]
    assert render(legacy, "text").encode() == reference(legacy, "")[0]
    assert render(legacy, "openmetrics").encode() == reference(legacy, om)[0]
