"""The step model, the simulated GPU and the ground-truth endpoints."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from sim_support import chat_body, get_json, metric_values

from llmtop.sim.engine import (
    GPU_WINDOW_S,
    EngineClosed,
    SimEngine,
    SimRequest,
    SimRequestError,
)
from llmtop.sim.profiles import get_profile
from llmtop.sim.server import running_sim


async def test_step_price_follows_the_documented_formula() -> None:
    """base + per_seq × batch + per_kv_token × context + prefill ÷ rate, and DRAM
    bandwidth = bytes read ÷ step time ÷ peak."""
    p = get_profile("h200-llama8b")
    engine = SimEngine(p)
    a = engine.submit(path="/x", stream=True, prompt_tokens=1000, max_tokens=10)
    b = engine.submit(path="/x", stream=True, prompt_tokens=3000, max_tokens=10)
    model_s, bw, busy = engine._plan()  # the admission step: both prefill
    ctx = 1001 + 3001
    expected = (p.base_step_s + 2 * p.per_seq_s + ctx * p.per_kv_token_s
                + 4000 / p.prefill_tokens_per_s)
    assert model_s == pytest.approx(expected)
    read = p.weights_bytes + ctx * p.kv_bytes_per_token
    assert bw == pytest.approx(read / expected / p.peak_bw_bytes_per_s)
    assert busy >= bw
    engine._emit()
    assert (a.generated, b.generated) == (1, 1)
    assert a.first_token is not None
    model_s, bw, _ = engine._plan()  # a pure decode step
    ctx = 1002 + 3002
    assert model_s == pytest.approx(p.base_step_s + 2 * p.per_seq_s + ctx * p.per_kv_token_s)
    # batch 1 decode of an 8B model on an H200 is bandwidth-bound: ≈ 84 % of peak
    assert 0.7 < bw < 0.95
    assert engine.state()["kv_tokens_used"] == ctx


async def test_engine_refuses_overlong_requests() -> None:
    engine = SimEngine(get_profile("tiny", max_model_len=100, kv_cache_tokens=100))
    with pytest.raises(SimRequestError, match="maximum context length is 100"):
        engine.submit(path="/x", stream=False, prompt_tokens=90, max_tokens=20)
    with pytest.raises(SimRequestError):
        engine.submit(path="/x", stream=False, prompt_tokens=100, max_tokens=None)
    r = engine.submit(path="/x", stream=False, prompt_tokens=95, max_tokens=None)
    assert r.target <= 5


async def test_stopped_engine_aborts_in_flight_and_refuses_new_work() -> None:
    engine = SimEngine(get_profile("tiny"))
    await engine.start()
    r = engine.submit(path="/x", stream=True, prompt_tokens=5, max_tokens=1000)
    await asyncio.sleep(0.05)
    assert r.state == "running" and r.generated > 0
    await engine.stop()
    assert r.state == "aborted" and r.event.is_set()
    assert engine.state()["running"] == engine.state()["kv_tokens_used"] == 0
    with pytest.raises(EngineClosed):
        engine.submit(path="/x", stream=True, prompt_tokens=5, max_tokens=10)


async def test_sim_gpu_state_and_requests_endpoints() -> None:
    async with running_sim("tiny", time_scale=0.5) as sim, aiohttp.ClientSession() as s:
        idle = (await get_json(sim.url + "/sim/gpu"))["gpus"][0]
        url = sim.url + "/v1/chat/completions"
        tasks = [asyncio.create_task(s.post(url, json=chat_body(400))) for _ in range(3)]
        # busy for more than the whole utilisation window (the three run ~3 s): util is
        # near 100 %, not the ~60 % of a window only 0.6 s busy, which a busy machine's
        # late requests and late steps pushed under 50 (49.27)
        await asyncio.sleep(GPU_WINDOW_S + 0.2)
        busy = (await get_json(sim.url + "/sim/gpu"))["gpus"][0]
        state = await get_json(sim.url + "/sim/state")
        # in-process, without an await in between, the two agree exactly
        gpu_now, state_now = sim.engine.gpu(), sim.engine.state()
        metrics = await metric_values(sim.url)
        for t in tasks:
            (await t).close()
        records = await get_json(sim.url + "/sim/requests")
    p = sim.profile
    assert idle["simulated"] is True
    assert idle["name"] == "Simulated sim-tiny on 8 GiB edge GPU (llmtop sim)"
    assert idle["util_gpu"] == 0 and idle["dram_bw_util"] == 0
    assert idle["mem_used_bytes"] == p.runtime_overhead_bytes + p.weights_bytes
    assert idle["mem_total_bytes"] == p.mem_total_bytes
    assert busy["util_gpu"] > 50
    assert 0 < busy["dram_bw_util"] <= busy["mem_busy"] <= 100
    assert busy["power_w"] > idle["power_w"]
    assert (gpu_now["mem_used_bytes"] == p.runtime_overhead_bytes + p.weights_bytes
            + state_now["kv_tokens_used"] * p.kv_bytes_per_token)
    assert state["running"] == 3 and state["waiting"] == 0
    assert state["kv_tokens_total"] == 2048
    assert 0 < state["kv_tokens_used"] <= 2048
    assert state["preemptions"] == 0
    assert 0.005 < state["step_s"] < 0.05
    assert metrics["vllm:num_requests_running"] == 3
    assert 0 < metrics["vllm:kv_cache_usage_perc"] <= 1
    assert metrics["vllm:time_to_first_token_seconds_count"] == 3
    assert metrics["vllm:prompt_tokens_total"] == 3 * 9  # 3 + 4 + ceil(len("hello") / 4)
    assert len(records) == 3
    keys = {"id", "arrival", "admitted", "first_token", "finished", "cancelled_at",
            "prompt_tokens", "completion_tokens", "preemptions", "chunks"}
    assert all(keys <= set(r) for r in records)
    assert all(r["arrival"] <= r["admitted"] <= r["first_token"] <= r["chunks"][0]
               for r in records)


async def test_a_stalled_host_does_not_read_as_an_idle_gpu() -> None:
    """Steps run back to back while there is work, so the GPU is busy the whole time; a
    host stall (here the loop blocked for 0.6 s, as a paused process or a busy machine
    would) stretches the step it delays. Counting only each step's modelled duration read
    such a window as ~40 % idle, and `test_sim_gpu_state_and_requests_endpoints` failed
    under tools/freeze_pytest.py."""
    engine = SimEngine(get_profile("tiny", time_scale=0.5))
    await engine.start()
    try:
        reqs = [engine.submit(path="/x", stream=True, prompt_tokens=5, max_tokens=400)
                for _ in range(3)]
        await asyncio.sleep(GPU_WINDOW_S + 0.1)
        steps = engine.steps
        time.sleep(0.6)  # noqa: ASYNC251 - the stall under test
        await asyncio.sleep(0.05)
        gpu = engine.gpu()
        assert all(r.state == "running" for r in reqs)
        assert engine.steps > steps  # the delayed step ran, and more after it
        assert gpu["util_gpu"] > 90
        assert 0 < gpu["dram_bw_util"] <= gpu["mem_busy"] <= 100
    finally:
        await engine.stop()
    await asyncio.sleep(GPU_WINDOW_S + 0.05)
    assert engine.gpu()["util_gpu"] == 0  # idle once the window has passed


async def test_a_busy_firehose_engine_reads_as_a_busy_gpu() -> None:
    """Firehose steps have no modelled duration; while it has work the engine is busy all
    the time, and the simulated GPU says so (it read 0 % before: no step was logged)."""
    engine = SimEngine(get_profile("tiny"), firehose=True)
    await engine.start()
    loop = asyncio.get_running_loop()
    end = loop.time() + GPU_WINDOW_S + 0.2
    submitted = 0
    try:
        open_now: list[SimRequest] = []
        while loop.time() < end:  # three open all the time, each ending in ms, not together
            open_now = [r for r in open_now if not r.done]
            while len(open_now) < 3:
                open_now.append(engine.submit(path="/x", stream=True, prompt_tokens=5,
                                              max_tokens=300 + 200 * (submitted % 5)))
                submitted += 1
            await asyncio.sleep(0.001)
        busy = engine.gpu()
    finally:
        await engine.stop()
    assert submitted > 3  # they did end, and new ones came
    assert busy["util_gpu"] > 90
    assert 0 < busy["dram_bw_util"] <= busy["mem_busy"] <= 100
    await asyncio.sleep(GPU_WINDOW_S + 0.05)
    assert engine.gpu()["util_gpu"] == 0


async def test_firehose_has_no_pacing_and_no_limits() -> None:
    """Firehose: every request is admitted at once (max_num_seqs=1 is ignored) and tokens
    come as fast as the loop turns; paced, the same work would take ≥ 8 × 200 × 11 ms."""
    async with running_sim("tiny", firehose=True, max_num_seqs=1) as sim, \
            aiohttp.ClientSession() as s:
        url = sim.url + "/v1/chat/completions"

        async def one() -> bytes:
            async with s.post(url, json=chat_body(200)) as r:
                return await r.read()

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        bodies = await asyncio.gather(*(one() for _ in range(8)))
        elapsed = loop.time() - t0
        records = sim.engine.records()
        state = sim.engine.state()
    assert all(b.count(b'"content":"') == 200 and b.endswith(b"[DONE]\n\n") for b in bodies)
    assert state["step_s"] == 0
    assert all(r["completion_tokens"] == 200 and r["preemptions"] == 0 for r in records)
    last_admitted = max(r["admitted"] for r in records)
    first_finished = min(r["finished"] for r in records)
    assert last_admitted < first_finished  # all eight ran side by side
    assert elapsed < 8 * 200 * 0.011 / 3
