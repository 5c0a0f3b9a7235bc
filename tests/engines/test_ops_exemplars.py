"""An exposition in OpenMetrics with exemplars (``value # {trace_id="..."} value ts`` after
a bucket's or counter's value): an engine whose exporter serves OpenMetrics whatever the
``Accept`` (or a gateway in front that does), with tracing on. Before, the first exemplar
failed the whole scrape ('is not Prometheus text (line N: ...)'): no engine reading at
all. The text is prometheus_client's own OpenMetrics encoder's, over a real socket."""

from __future__ import annotations

import math

import aiohttp
from aiohttp import web
from net_support import serving
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmtop.engines.exposition import iter_samples
from llmtop.engines.scraper import EngineScraper


def exposition() -> str:
    reg = CollectorRegistry()
    Gauge("vllm:num_requests_running", "Running.", ["model_name"], registry=reg).labels(
        "m").set(4)
    Gauge("vllm:num_requests_waiting", "Waiting.", ["model_name"], registry=reg).labels(
        "m").set(2)
    pre = Counter("vllm:num_preemptions", "Preemptions.", ["model_name"], registry=reg)
    pre.labels("m").inc(3, exemplar={"trace_id": "abc"})
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", ["model_name"],
                     buckets=(0.1, 1.0), registry=reg)
    for v, trace in ((0.05, "t1"), (0.5, "t2 \"}# x"), (2.0, "t3")):
        ttft.labels("m").observe(v, exemplar={"trace_id": trace})
    # allow-utf-8: names as written (under "underscores" prometheus_client writes
    # vllm_num_requests_running in OpenMetrics: llmtop.metrics.promtext says why)
    return generate_latest(reg, escaping="allow-utf-8").decode()


def test_exemplars_are_read_past_as_prometheus_clients_parser_does() -> None:
    """(Its OpenMetrics parser refuses the hostile exemplar its own encoder wrote; its
    text parser reads every line.)"""
    text = exposition()
    assert ' # {trace_id="t2 \\"}# x"} 0.5 ' in text  # an exemplar, and a hostile one
    ours = [(n, labels, v) for n, labels, v in iter_samples(text)]
    theirs = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text)
              for s in f.samples]
    assert ours == theirs


async def test_an_exposition_with_exemplars_is_scraped() -> None:
    text = exposition()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="application/openmetrics-text")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(url + "/metrics", session, lambda e: None)
        r = await sc.scrape_once(session)
    assert (r.kind, r.running, r.waiting, r.preemptions) == ("vllm", 4.0, 2.0, 3.0)
    assert r.ttft_buckets == ((0.1, 1.0), (1.0, 2.0), (math.inf, 3.0))
