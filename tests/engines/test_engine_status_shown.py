"""Why there are no engine or GPU figures reaches the user: the scraper's and the GPU
source's lines are in the snapshot (``engine.status``, ``gpu_status``) — they were kept by
objects nothing read, so a 404 on the engine's /metrics or a GPU that could not be read
showed only as n/a."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import aiohttp
from aiohttp import web

from llmtop.config import load_config
from llmtop.metrics.merge import merge_snapshots
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim


async def _snapshot(admin: str, want: str) -> dict[str, Any]:
    """The 10 s snapshot once its engine status holds ``want`` (the first scrape is due
    at start-up; its failure a moment later)."""
    snap: dict[str, Any] = {}
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(admin + "/llmtop/v1/snapshot?window=10") as r:
                snap = await r.json()
            if want in (snap["engine"].get("status") or ""):
                break
            await asyncio.sleep(0.05)
    return snap


async def test_an_upstream_without_metrics_says_why_in_the_snapshot() -> None:
    app = web.Application()  # an OpenAI-compatible server with no /metrics at all
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    cfg = load_config(None, env={}, overrides={
        "upstream": f"http://127.0.0.1:{port}", "listen": "127.0.0.1:0",
        "admin": "127.0.0.1:0", "gpu.source": "auto"})
    server = LlmtopServer(cfg, out=io.StringIO())
    await server.start()
    try:
        snap = await _snapshot(server.admin_url, "HTTP 404")
    finally:
        await server.stop(0)
        await runner.cleanup()
    assert snap["engine"]["kind"] is None
    assert snap["engine"]["status"] == f"no /metrics at http://127.0.0.1:{port}/metrics (HTTP 404)"
    # no NVIDIA GPU on this machine (CI's neither): the reason, not an empty panel
    assert snap["gpus"] == []
    assert "no NVIDIA GPU found" in snap["gpu_status"]


async def test_a_scraped_engine_and_its_gpu_are_named_and_merged() -> None:
    async with running_sim("tiny", time_scale=0.05) as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "sim"})
        server = LlmtopServer(cfg, out=io.StringIO())
        await server.start()
        try:
            snap = await _snapshot(server.admin_url, "engine at")
            for _ in range(100):  # the simulated GPU's first reading
                if snap["gpus"]:
                    break
                await asyncio.sleep(0.05)
                snap = await _snapshot(server.admin_url, "engine at")
        finally:
            await server.stop(0)
    assert snap["engine"]["kind"] == "sim"
    assert snap["engine"]["status"].startswith("sim engine at ")
    assert snap["gpu_status"] == "1 simulated GPU"
    other = dict(snap, engine={**snap["engine"], "kind": None, "status": "no /metrics"},
                 gpu_status="GPU 1 lost", upstream="http://elsewhere:1")
    merged = merge_snapshots([snap, other])
    assert merged["engine"]["kind"] == "sim"  # the one reading there is
    assert merged["gpu_status"] == "1 simulated GPU · GPU 1 lost"
    none = merge_snapshots([other, dict(other, host="h2")])
    assert none["engine"]["kind"] is None and none["engine"]["status"] == "no /metrics"
