"""``gpu.sim_url`` with credentials (``http://user:password@host/sim/gpu``): the status
lines (the screens, the admin API's snapshot that ``llmtop attach`` reads from other
machines) show the password as ``***``, as the engine scraper's do; the request still
carries them."""

from __future__ import annotations

import asyncio
import base64

from aiohttp import web
from net_support import serving

from llmtop.gpu.simsource import SimGpuSource

SECRET = "s3cret-Pa55"


async def _two_failures(src: SimGpuSource) -> None:
    """Run ``src`` until two polls have failed (at most 5 s), then stop it."""
    task = asyncio.create_task(src.run())
    try:
        for _ in range(500):
            if src.failures >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.wait([task])


async def test_the_password_in_a_sim_gpu_url_is_not_shown() -> None:
    seen: list[str | None] = []

    async def gpu(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(status=500, text="no")

    async with serving(web.get("/sim/gpu", gpu)) as url:
        netloc = url.removeprefix("http://")
        src = SimGpuSource(f"http://bob:{SECRET}@{netloc}/sim/gpu", None, lambda e: None,
                           interval_s=0.01, max_backoff_s=0.02)
        assert SECRET not in src.status and "bob:***@" in src.status
        await _two_failures(src)
    assert src.failures >= 2 and "HTTP 500" in src.status
    assert SECRET not in src.status and "bob:***@" in src.status
    assert seen and seen[0] == "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()


async def _ok(request: web.Request) -> web.Response:
    return web.Response()


async def test_a_refused_connection_does_not_show_it_either() -> None:
    async with serving(web.get("/sim/gpu", _ok)) as url:
        netloc = url.removeprefix("http://")
    src = SimGpuSource(f"http://bob:{SECRET}@{netloc}/sim/gpu", None, lambda e: None,
                       interval_s=0.01, max_backoff_s=0.02)
    await _two_failures(src)
    assert "simulated GPU unavailable at http://bob:***@" in src.status
    assert SECRET not in src.status
