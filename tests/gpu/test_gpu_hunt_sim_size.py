"""gpu.source = sim polls a URL for JSON (the simulator's /sim/gpu; gpu.sim_url may name
any): a body far larger than any simulator sends must be refused once past a bound, not
read whole into memory and parsed. Over a real socket (aiohttp on 127.0.0.1)."""

from __future__ import annotations

import time

import aiohttp
import pytest
from aiohttp import web
from net_support import serving

from llmtop.gpu.simsource import MAX_BYTES, SimGpuSource

CHUNK = b'{"index": 0, "name": "' + b"x" * 65536 + b'"},'


async def endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.content_type = "application/json"
    await resp.prepare(request)
    await resp.write(b'{"gpus": [')
    sent = 0
    try:
        while sent < 512 * 1024 * 1024:  # at most 512 MB, unless the client hangs up
            await resp.write(CHUNK)
            sent += len(CHUNK)
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def test_an_oversized_sim_gpu_body_is_refused_past_the_bound() -> None:
    async with serving(web.get("/sim/gpu", endless)) as url, \
            aiohttp.ClientSession() as session:
        src = SimGpuSource(url + "/sim/gpu", session, lambda e: None)
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=f"larger than {MAX_BYTES} bytes"):
            await src.poll_once(session)
        assert time.monotonic() - t0 < 5.0
    assert src.latest() == []


async def test_a_normal_body_still_reads() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"gpus": [{"index": 0, "name": "sim", "power_w": 100}]})

    async with serving(web.get("/sim/gpu", ok)) as url, aiohttp.ClientSession() as session:
        src = SimGpuSource(url + "/sim/gpu", session, lambda e: None)
        [r] = await src.poll_once(session)
    assert (r.name, r.power_w, r.simulated) == ("sim", 100.0, True)
