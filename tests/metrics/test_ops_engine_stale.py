"""``GET /metrics`` exports the engine's readings (``llmtop_engine_running``, ``_waiting``,
``_kv_cache_usage_ratio``, ``_preemptions``) only while they are current: "absent when
unavailable", as the collector's docstring says. Before, the last reading of an engine
whose ``/metrics`` then failed (HTTP 503 here: an overloaded or hung engine) was exported
for good: 20 s after the failure, ``llmtop_engine_running 7`` and
``llmtop_engine_kv_cache_usage_ratio 0.9`` were still there, so Prometheus drew a flat
line and a KV-cache alert kept firing (or never fired) on a number nobody had read. (The
snapshot has the reading's ``age_s`` and the scraper's status; a Prometheus user had
nothing.) End to end: the engine's ``/metrics`` over a real socket, ``llmtop run``
scraping it, its admin ``/metrics`` parsed with prometheus_client."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
from aiohttp import web
from net_support import serving
from proc_support import start_headless
from prometheus_client.parser import text_string_to_metric_families

from llmtop.engines.scraper import current_for_s

TEXT = ('vllm:num_requests_running{model_name="m"} 7\n'
        'vllm:num_requests_waiting{model_name="m"} 3\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.9\n'
        'vllm:num_preemptions_total{model_name="m"} 2\n')
ENGINE = ("llmtop_engine_running", "llmtop_engine_waiting",
          "llmtop_engine_kv_cache_usage_ratio", "llmtop_engine_preemptions")


async def engine_samples(s: aiohttp.ClientSession, admin: str) -> dict[str, float]:
    async with s.get(admin + "/metrics") as r:
        text = await r.text()
    return {x.name: x.value for f in text_string_to_metric_families(text)
            for x in f.samples if x.name in ENGINE}


async def test_an_engine_reading_no_longer_current_is_not_exported() -> None:
    up = True

    async def metrics(request: web.Request) -> web.Response:
        if not up:
            return web.Response(status=503, text="engine overloaded")
        return web.Response(text=TEXT)

    async with serving(web.get("/metrics", metrics)) as url:
        proc, _, admin = await start_headless(
            "--upstream", url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--gpu-source", "none")
        try:
            async with aiohttp.ClientSession() as s:
                got: dict[str, float] = {}
                for _ in range(100):
                    got = await engine_samples(s, admin)
                    if got:
                        break
                    await asyncio.sleep(0.1)
                assert got == {"llmtop_engine_running": 7.0, "llmtop_engine_waiting": 3.0,
                               "llmtop_engine_kv_cache_usage_ratio": 0.9,
                               "llmtop_engine_preemptions": 2.0}
                up = False
                # still there a moment after the failure (one failed scrape is not the
                # engine's state gone)...
                await asyncio.sleep(2)
                assert len(await engine_samples(s, admin)) == 4
                # ...gone past the limit: 3 scrape intervals, at least 5 s, plus the
                # longest a scrape may take (5 s at a 1 s interval)
                await asyncio.sleep(current_for_s(1.0) + 1)
                assert await engine_samples(s, admin) == {}
                async with s.get(admin + "/llmtop/v1/snapshot") as r:
                    engine = (await r.json())["engine"]
                assert "HTTP 503" in engine["status"]  # the snapshot's view, unchanged
                assert engine["running"] == 7.0 and engine["age_s"] > current_for_s(1.0)
                up = True  # back: exported again at the next scrape
                for _ in range(100):
                    got = await engine_samples(s, admin)
                    if got:
                        break
                    await asyncio.sleep(0.2)
                assert got["llmtop_engine_running"] == 7.0
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
