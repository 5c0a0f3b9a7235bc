"""A client that goes away is noticed by the engine at once, streaming or queued."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from sim_support import chat_body

from llmtop.sim.server import running_sim


async def _until(cond: object, within: float = 2.0) -> float:
    """Poll ``cond()`` every millisecond; returns the time it became true."""
    deadline = time.time() + within
    while time.time() < deadline:
        if cond():  # type: ignore[operator]
            return time.time()
        await asyncio.sleep(0.001)
    raise AssertionError("condition not met in time")


async def test_disconnect_mid_stream_is_noticed_quickly() -> None:
    async with running_sim("tiny") as sim:
        session = aiohttp.ClientSession()
        resp = await session.post(sim.url + "/v1/chat/completions", json=chat_body(500))
        got = 0
        async for line in resp.content:
            if b'"content":"' in line:
                got += 1
                if got == 3:
                    break
        assert sim.engine.state()["running"] == 1
        closed = time.time()
        resp.close()
        await session.close()
        await _until(lambda: sim.engine.state()["running"] == 0)
        rec = sim.engine.records()[-1]
    assert rec["state"] == "cancelled"
    assert rec["cancelled_at"] is not None
    # noticed within a few ms of the close (generous bound for a busy machine)
    assert rec["cancelled_at"] - closed < 0.25
    assert rec["finished"] is None
    assert 3 <= rec["completion_tokens"] < 500
    assert sim.engine.state()["kv_tokens_used"] == 0


async def test_disconnect_while_queued_leaves_the_queue() -> None:
    async with running_sim("tiny", max_num_seqs=1) as sim, aiohttp.ClientSession() as s:
        first = await s.post(sim.url + "/v1/chat/completions", json=chat_body(300))
        queued = asyncio.create_task(
            s.post(sim.url + "/v1/chat/completions", json=chat_body(5, stream=False)))
        await _until(lambda: sim.engine.state()["waiting"] == 1)
        closed = time.time()
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        await _until(lambda: sim.engine.state()["waiting"] == 0)
        rec = sim.engine.records()[-1]
        assert rec["state"] == "cancelled"
        assert rec["admitted"] is None
        assert rec["cancelled_at"] - closed < 0.25
        assert sim.engine.state()["running"] == 1
        first.close()
