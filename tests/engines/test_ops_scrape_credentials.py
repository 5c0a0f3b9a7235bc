"""``engine.metrics_url`` with credentials (``http://user:password@gateway/metrics``: a
gateway that guards the engine's ``/metrics`` with basic auth). aiohttp sends them, and
the scrape works; but every status line wrote the URL as given, password included: the
snapshot's ``engine.status`` (the admin API, which ``llmtop attach`` reads from other
machines), the screens, and the lines of a failed scrape. The upstream URL refuses
``user:password@`` for that reason. Now the password is shown as ``***``. End to end:
a gateway over a real socket that wants the credentials, a real ``llmtop run``."""

from __future__ import annotations

import asyncio
import base64
import signal
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from net_support import serving
from proc_support import start_headless

from llmtop.engines.scraper import EngineScraper, ScrapeError

TEXT = 'vllm:num_requests_running{model_name="m"} 7\n'
SECRET = "s3cret-Pa55"


async def test_the_password_of_a_metrics_url_is_not_shown(tmp_path: Path) -> None:
    want = "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()

    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != want:
            return web.Response(status=401, text="credentials, please")
        return web.Response(text=TEXT)

    async with serving(web.get("/metrics", metrics)) as url:
        netloc = url.removeprefix("http://")
        conf = tmp_path / "llmtop.toml"
        conf.write_text(f'[engine]\nmetrics_url = "http://bob:{SECRET}@{netloc}/metrics"\n')
        proc, _, admin = await start_headless(
            "--upstream", url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--gpu-source", "none", "--config", str(conf))
        try:
            async with aiohttp.ClientSession() as s:
                engine: dict[str, object] = {}
                for _ in range(100):
                    async with s.get(admin + "/llmtop/v1/snapshot") as r:
                        body = await r.text()
                    engine = (await r.json())["engine"]
                    if engine["running"] is not None:
                        break
                    await asyncio.sleep(0.1)
            assert engine["running"] == 7.0  # the credentials are still sent
            assert engine["status"] == f"vllm engine at http://bob:***@{netloc}/metrics"
            assert SECRET not in body
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert SECRET not in out.decode()


async def test_nor_in_a_failed_scrapes_status() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(status=401, text="credentials, please")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        netloc = url.removeprefix("http://")
        sc = EngineScraper(f"http://bob:{SECRET}@{netloc}/metrics", session, lambda e: None)
        assert SECRET not in sc.status
        with pytest.raises(ScrapeError) as failed:
            await sc.scrape_once(session)
        said = sc.explain(failed.value)  # the poller's status line
        assert said == (f"http://bob:***@{netloc}/metrics: HTTP 401 (the credentials in "
                        "engine.metrics_url were refused)"), said
        assert SECRET not in said
