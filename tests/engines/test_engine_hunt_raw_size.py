"""EngineReading.raw is stored in the recording with every scrape (once a second): a
sample whose key is huge (a label value of megabytes) must not go into it, or the
recording grows by that much every second. Scraped over a real socket."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from net_support import serving

from llmtop.engines.recognise import RAW_KEY_LIMIT
from llmtop.engines.scraper import EngineScraper

BIG = "x" * (1024 * 1024)
BODY = ('vllm:num_requests_running{model_name="m"} 3\n'
        f'vllm:lora_requests_info{{running_lora_adapters="{BIG}"}} 1\n'
        'vllm:num_requests_waiting{model_name="m"} 2\n')


async def test_a_huge_raw_key_is_left_out_the_rest_kept() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=BODY, content_type="text/plain")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(url + "/metrics", session, lambda e: None)
        reading = await sc.scrape_once(session)
    assert (reading.running, reading.waiting) == (3.0, 2.0)
    assert set(reading.raw) == {'vllm:num_requests_running{model_name="m"}',
                                'vllm:num_requests_waiting{model_name="m"}'}
    assert sum(len(k) for k in reading.raw) < RAW_KEY_LIMIT


def test_a_key_at_the_limit_is_kept() -> None:
    from llmtop.engines.recognise import recognise

    name = "m"
    value = "v" * (RAW_KEY_LIMIT - len(name) - len('{a=""}'))
    r = recognise(f'{name}{{a="{value}"}} 1\n', 0.0)
    [key] = r.raw
    assert len(key) == RAW_KEY_LIMIT
