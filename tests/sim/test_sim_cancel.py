"""A client that goes away is noticed by the engine at once, streaming or queued."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from sim_support import chat_body, metric_values

from llmtop.sim.server import running_sim


async def _until(cond: object, within: float = 2.0) -> float:
    """Poll ``cond()`` every millisecond; returns the time it became true."""
    deadline = time.time() + within
    while time.time() < deadline:
        if cond():  # type: ignore[operator]
            return time.time()
        await asyncio.sleep(0.001)
    raise AssertionError("condition not met in time")


# How soon, in the engine's decode steps (tiny: one per 10 ms, and never more than one per
# wake-up of the loop that client, handler and engine share; unstalled 0-1), not in seconds
# (< 0.25 s before): a freeze of the test process between the close and the cancel counted
# against the engine in seconds though it stepped no more in it. 20 steps is 0.2-0.25 s of
# the engine's time; the cancel put off 0.3 s (call_later in the handler) takes 24-25.
MAX_STEPS = 20


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
        steps = sim.engine.steps
        resp.close()
        await session.close()
        await _until(lambda: sim.engine.state()["running"] == 0)
        steps = sim.engine.steps - steps  # none once it is cancelled: nothing else runs
        rec = sim.engine.records()[-1]
        metrics = await metric_values(sim.url)
    assert rec["state"] == "cancelled"
    assert rec["cancelled_at"] is not None
    # vLLM V1 counts an aborted request under finished_reason="abort"
    assert metrics['vllm:request_success_total{finished_reason=abort}'] == 1
    assert metrics['vllm:request_success_total{finished_reason=stop}'] == 0
    # noticed within a few ms of the close: counted in the engine's decode steps
    assert steps <= MAX_STEPS, steps
    assert rec["finished"] is None
    assert 3 <= rec["completion_tokens"] < 500
    assert sim.engine.state()["kv_tokens_used"] == 0


async def test_disconnect_while_queued_leaves_the_queue() -> None:
    async with running_sim("tiny", max_num_seqs=1) as sim, aiohttp.ClientSession() as s:
        first = await s.post(sim.url + "/v1/chat/completions", json=chat_body(300))
        queued = asyncio.create_task(
            s.post(sim.url + "/v1/chat/completions", json=chat_body(5, stream=False)))
        await _until(lambda: sim.engine.state()["waiting"] == 1)
        steps = sim.engine.steps
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        await _until(lambda: sim.engine.state()["waiting"] == 0)
        steps = sim.engine.steps - steps  # (the first request's, and one of polling at most)
        rec = sim.engine.records()[-1]
        assert rec["state"] == "cancelled"
        assert rec["admitted"] is None
        assert steps <= MAX_STEPS, steps
        assert sim.engine.state()["running"] == 1
        first.close()
