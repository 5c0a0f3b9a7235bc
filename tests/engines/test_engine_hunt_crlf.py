"""An exposition with CRLF line ends (a Windows-hosted exporter) and blank lines between
metric families: the blank lines are "\\r" once split at "\\n", and must be skipped as
blank lines are — prometheus_client's parser reads it. Over a real socket."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from net_support import serving
from prometheus_client.parser import text_string_to_metric_families

from llmtop.engines.exposition import iter_samples
from llmtop.engines.scraper import EngineScraper

TEXT = ("# HELP vllm:num_requests_running Running.\r\n"
        "# TYPE vllm:num_requests_running gauge\r\n"
        'vllm:num_requests_running{model_name="m"} 4\r\n'
        "\r\n"
        "# TYPE vllm:num_requests_waiting gauge\r\n"
        'vllm:num_requests_waiting{model_name="m"} 2\r\n'
        " \t\r\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\r\n')


def test_crlf_blank_lines_are_skipped_as_prometheus_client_does() -> None:
    ours = [(n, v) for n, _, v in iter_samples(TEXT)]
    theirs = [(s.name, s.value) for f in text_string_to_metric_families(TEXT)
              for s in f.samples]
    assert ours == theirs == [("vllm:num_requests_running", 4.0),
                              ("vllm:num_requests_waiting", 2.0),
                              ("vllm:kv_cache_usage_perc", 0.5)]


async def test_a_crlf_exposition_is_scraped() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=TEXT, content_type="text/plain")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(url + "/metrics", session, lambda e: None)
        r = await sc.scrape_once(session)
    assert (r.kind, r.running, r.waiting, r.kv_cache_usage) == ("vllm", 4.0, 2.0, 0.5)
