"""SimGpuSource over real sockets: our own aiohttp server, then llmtop's simulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmtop.events import Event, GpuReading
from llmtop.gpu.simsource import SimGpuSource, readings_from_json

GPU_JSON: dict[str, Any] = {
    "gpus": [
        {"index": 0, "name": "Simulated H200", "mem_used_bytes": 80_000_000_000,
         "mem_total_bytes": 141_000_000_000, "util_gpu": 71.5, "mem_busy": 40.0,
         "dram_bw_util": 63.25, "power_w": 450.0, "simulated": True},
        {"index": 1, "name": "Simulated H200 #2", "mem_used_bytes": 1, "mem_total_bytes": 2,
         "util_gpu": None, "mem_busy": None, "dram_bw_util": None, "power_w": None,
         "simulated": False, "sm_activity": 12.0},
    ]
}


class Server:
    def __init__(self) -> None:
        self.status = 200
        self.body: Any = GPU_JSON
        self.hits = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        if self.status != 200:
            return web.Response(status=self.status, text="nope")
        if isinstance(self.body, str):
            return web.Response(text=self.body, content_type="application/json")
        return web.json_response(self.body)


@contextlib.asynccontextmanager
async def serve(server: Server) -> AsyncIterator[Server]:
    app = web.Application()
    app.router.add_get("/sim/gpu", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}/sim/gpu"
    try:
        yield server
    finally:
        await runner.cleanup()


async def until(cond: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``cond`` every 10 ms for up to ``limit_s`` seconds."""
    for _ in range(int(limit_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@contextlib.asynccontextmanager
async def running(source: SimGpuSource) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(source.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_polls_and_publishes_simulated_readings() -> None:
    """Every entry becomes a GpuReading marked simulated — even one whose JSON says not."""
    published: list[Event] = []
    async with serve(Server()) as srv:
        src = SimGpuSource(srv.url, None, published.append, interval_s=0.02, clock=lambda: 7.0)
        async with running(src):
            await until(lambda: src.polls >= 2)
    assert src.status == "2 simulated GPUs"
    first, second = src.latest()
    assert first == GpuReading(
        t=7.0, index=0, name="Simulated H200", mem_used_bytes=80_000_000_000,
        mem_total_bytes=141_000_000_000, util_gpu=71.5, mem_busy=40.0, dram_bw_util=63.25,
        power_w=450.0, simulated=True,
    )
    assert second.simulated is True and second.util_gpu is None and second.sm_activity == 12.0
    assert len([e for e in published if isinstance(e, GpuReading)]) >= 4


async def test_errors_become_status_and_it_recovers() -> None:
    """HTTP 500, then malformed JSON, then good: status follows, the loop never dies."""
    srv = Server()
    srv.status = 500
    async with serve(srv):
        src = SimGpuSource(srv.url, None, lambda e: None, interval_s=0.01, max_backoff_s=0.05)
        async with running(src) as task:
            await until(lambda: src.failures >= 2)
            assert "HTTP 500" in src.status and "retrying" in src.status
            srv.status, srv.body = 200, '{"gpus": "many"}'
            await until(lambda: "expected" in src.status)
            srv.body = GPU_JSON
            await until(lambda: src.polls >= 1)
            assert src.failures == 0 and not task.done()
    assert src.status == "2 simulated GPUs"


async def test_connection_refused_is_a_status_not_a_crash() -> None:
    async with serve(Server()) as srv:
        url = srv.url
    # the server is gone: nothing listens on that port now
    async with aiohttp.ClientSession() as session:
        src = SimGpuSource(url, session, lambda e: None, interval_s=0.01, max_backoff_s=0.02)
        async with running(src) as task:
            await until(lambda: src.failures >= 3)
            assert not task.done()
        assert "simulated GPU unavailable at" in src.status
        assert not session.closed  # a session passed in is the caller's to close


def test_readings_from_json_validation() -> None:
    with pytest.raises(ValueError, match="expected"):
        readings_from_json([], 0.0)
    with pytest.raises(ValueError, match="not a number"):
        readings_from_json({"gpus": [{"index": 0, "util_gpu": "high"}]}, 0.0)
    with pytest.raises(ValueError, match="index"):
        readings_from_json({"gpus": [{"index": "0"}]}, 0.0)
    (r,) = readings_from_json({"gpus": [{"index": 3}]}, 1.0)
    assert r.name == "sim GPU 3" and r.mem_total_bytes is None and r.simulated


async def test_against_llmtop_sim() -> None:
    """The simulator's own /sim/gpu, over a real socket."""
    from llmtop.sim.server import running_sim

    async with running_sim("tiny") as sim:
        src = SimGpuSource(sim.url + "/sim/gpu", None, lambda e: None, interval_s=0.02)
        async with running(src):
            await until(lambda: src.polls >= 1)
    (r,) = src.latest()
    assert r.simulated and r.index == 0 and "llmtop sim" in r.name
    assert r.mem_total_bytes and r.mem_used_bytes and r.mem_used_bytes <= r.mem_total_bytes
    assert r.dram_bw_util is not None and 0.0 <= r.dram_bw_util <= 100.0
