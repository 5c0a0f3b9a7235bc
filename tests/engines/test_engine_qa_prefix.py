"""QA: an upstream with a path prefix (a gateway route such as ``http://gw/llama``, or
llama-server's ``--api-prefix``). The proxy forwards under the prefix, so the engine's
``/metrics`` is under it too; scraping the origin's ``/metrics`` read the gateway's own
metrics ("unknown engine") or a 404 instead of the engine's. Over a real socket: an aiohttp
server with a gateway's /metrics at the root and a vLLM exposition under /llama."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from net_support import serving

from llmtop.config import Config
from llmtop.engines import metrics_url_for, open_engine_scraper

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
GATEWAY = "# TYPE gateway_requests_total counter\ngateway_requests_total 12\n"


@pytest.mark.parametrize(("upstream", "url"), [
    ("http://h:8000", "http://h:8000/metrics"),
    ("http://h:8000/", "http://h:8000/metrics"),
    ("http://h:8000/v1", "http://h:8000/metrics"),
    ("http://h:8000/v1/", "http://h:8000/metrics"),
    ("http://gw/llama", "http://gw/llama/metrics"),
    ("http://gw/llama/", "http://gw/llama/metrics"),
    ("http://gw/llama/v1", "http://gw/llama/metrics"),
    ("https://gw:8443/a/b/v1?x=1", "https://gw:8443/a/b/metrics"),
    ("http://gw/v1x", "http://gw/v1x/metrics"),
])
def test_metrics_url_keeps_the_prefix(upstream: str, url: str) -> None:
    assert metrics_url_for(upstream) == url


@contextlib.asynccontextmanager
async def gateway() -> AsyncIterator[str]:
    vllm = (FIXTURES / "vllm_v1_metrics.txt").read_text()

    async def root_metrics(request: web.Request) -> web.Response:
        return web.Response(text=GATEWAY, content_type="text/plain")

    async def engine_metrics(request: web.Request) -> web.Response:
        return web.Response(text=vllm, content_type="text/plain")

    async with serving(web.get("/metrics", root_metrics),
                       web.get("/llama/metrics", engine_metrics)) as url:
        yield url


@pytest.mark.parametrize("suffix", ["/llama", "/llama/v1"])
async def test_scrapes_the_engine_under_the_prefix(suffix: str) -> None:
    async with gateway() as base, aiohttp.ClientSession() as session:
        sc = open_engine_scraper(Config(), lambda e: None, upstream=base + suffix,
                                 session=session)
        assert sc is not None
        reading = await asyncio.wait_for(sc.scrape_once(session), 5.0)
    assert reading.kind == "vllm" and reading.running == 21.0
    assert sc.describe(reading) == f"vllm engine at {base}/llama/metrics"
