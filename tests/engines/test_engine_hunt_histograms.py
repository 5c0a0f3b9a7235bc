"""The engine's TTFT histogram as llmtop reads it when the exposition is not textbook:
a series without its ``+Inf`` bucket. Scraped over a real socket from our own aiohttp
server, then read with the quantile the admin snapshot uses."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from llmtop.engines import EngineScraper
from llmtop.engines.recognise import recognise
from llmtop.metrics.snapshot import bucket_quantile

# 100 first tokens, 90 of them slower than the last finite bound (1 s): the true p95 is
# above 1 s, whatever else is unknown. Only _count says how many there were.
NO_INF = """\
vllm:num_requests_running{model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 5
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 10
vllm:time_to_first_token_seconds_count{model_name="m"} 100
vllm:time_to_first_token_seconds_sum{model_name="m"} 400
"""


async def scrape(body: str) -> tuple[tuple[float, float], ...]:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        async with aiohttp.ClientSession() as session:
            sc = EngineScraper(url, session, lambda e: None)
            reading = await sc.scrape_once(session)
    finally:
        await runner.cleanup()
    return reading.ttft_buckets


async def test_a_histogram_without_inf_takes_its_total_from_count() -> None:
    """Without +Inf the last finite bucket passed for the total: the snapshot's p95 read
    0.91 s while 90 of the 100 first tokens took over 1 s. Prometheus' _count is the
    +Inf bucket's count."""
    buckets = await scrape(NO_INF)
    assert buckets[-1] == (float("inf"), 100.0)
    p95 = bucket_quantile(buckets, 0.95)
    assert p95 is not None and p95 >= 1.0


def test_a_histogram_without_inf_or_count_gives_no_buckets() -> None:
    """Nothing says how many observations there were: no quantile rather than one made
    up from the finite buckets."""
    text = "\n".join(line for line in NO_INF.splitlines() if "_count" not in line) + "\n"
    buckets = recognise(text, 0.0).ttft_buckets
    assert bucket_quantile(buckets, 0.95) is None


def test_series_are_completed_one_by_one() -> None:
    """Two models: one with +Inf, one without (its _count stands in); the total is both."""
    text = NO_INF + """\
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="n"} 50
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="n"} 50
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="n"} 50
vllm:time_to_first_token_seconds_count{model_name="n"} 50
"""
    buckets = recognise(text, 0.0).ttft_buckets
    assert buckets == ((0.1, 55.0), (1.0, 60.0), (float("inf"), 150.0))
