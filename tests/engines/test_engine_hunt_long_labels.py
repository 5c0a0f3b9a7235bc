"""A valid /metrics line whose label value is long (megabytes: a config or prompt put in a
label) must be read in time proportional to it, at a few ms per MB: the label reader is
one regular-expression call, which holds the interpreter lock (shared with the forwarding
path) for as long as it runs. Over a real socket (aiohttp on 127.0.0.1)."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web
from net_support import serving

from llmtop.engines.exposition import iter_samples
from llmtop.engines.scraper import MAX_BYTES, EngineScraper

VALUE = "A" * (8 * 1024 * 1024)
BODY = ('vllm:num_requests_running{model_name="m"} 3\n'
        f'vllm:cache_config_info{{block_size="16",note="{VALUE}",x="a \\"b\\""}} 1\n')


async def test_a_long_label_value_is_read_in_linear_time() -> None:
    """8 MB in one label value took 2.4 s of CPU (0.3 s a MB, and worse than linear
    further on: 15 MB took 19 s) in one call holding the interpreter lock; now well
    under a second."""
    assert len(BODY) < MAX_BYTES

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=BODY, content_type="text/plain")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(url + "/metrics", session, lambda e: None)
        cpu0 = time.process_time()
        reading = await sc.scrape_once(session)
        cpu = time.process_time() - cpu0
    assert reading.kind == "vllm" and reading.running == 3.0
    assert cpu < 1.0, f"{cpu:.2f} s of CPU"


def test_the_labels_are_read_right() -> None:
    [_, (name, labels, value)] = list(iter_samples(BODY))
    assert (name, value) == ("vllm:cache_config_info", 1.0)
    assert labels == {"block_size": "16", "note": VALUE, "x": 'a "b"'}
