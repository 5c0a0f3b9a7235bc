"""The engine behaves like a continuous-batching server: queueing, preemption, batch- and
prefill-dependent inter-token latency. Clients are real (openai SDK / aiohttp)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import aiohttp
import openai
from sim_support import chat_body, metric_values

from llmtop.sim.server import running_sim


async def _stream_chat(c: openai.AsyncOpenAI, max_tokens: int, content: str = "hi"
                       ) -> tuple[str, float, int]:
    """(response id, client-side TTFT, completion tokens from usage)."""
    t0 = time.time()
    ttft = None
    usage = 0
    rid = ""
    stream = await c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        rid = chunk.id
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.time() - t0
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    assert ttft is not None
    return rid, ttft, usage


async def test_queueing_raises_ttft_and_shows_waiting() -> None:
    """4 × max_num_seqs concurrent requests: later ones wait for whole earlier waves, so
    their TTFT is much larger, and /metrics shows requests waiting meanwhile."""
    async with running_sim("tiny", time_scale=0.5) as sim, openai.AsyncOpenAI(
            base_url=sim.url + "/v1", api_key="x", max_retries=0) as c:
        await c.models.list()  # warm the client up: its first request is slow
        n = 4 * sim.profile.max_num_seqs
        waiting_seen: list[float] = []

        async def scrape() -> None:
            while True:
                m = await metric_values(sim.url)
                waiting_seen.append(m["vllm:num_requests_waiting"])
                await asyncio.sleep(0.02)

        scraper = asyncio.create_task(scrape())
        results = await asyncio.gather(*(_stream_chat(c, 10) for _ in range(n)))
        scraper.cancel()
        await asyncio.gather(scraper, return_exceptions=True)
        records = sorted(sim.engine.records(), key=lambda r: r["arrival"])
    assert all(usage == 10 for _, _, usage in results)
    assert len(records) == n
    # engine side: arrival → first token, in arrival order
    server = [r["first_token"] - r["arrival"] for r in records]
    early, late = statistics.mean(server[:4]), statistics.mean(server[-4:])
    # a wave is ~10 steps of ≥ 5.5 ms (scaled): the last wave waits ≥ 3 waves ≈ 165 ms
    assert late > early + 0.08, (early, late)
    # client side, same order: the later requests saw it too
    client = {rid: ttft for rid, ttft, _ in results}
    seen = [client[r["id"]] for r in records]
    assert statistics.mean(seen[-4:]) > statistics.mean(seen[:4]) + 0.05, seen
    assert max(waiting_seen) > 0


async def test_kv_exhaustion_preempts_newest_and_still_completes() -> None:
    """Four requests whose KV needs outgrow the cache: the newest running ones are
    preempted (counted in /metrics and per request), recompute, and still deliver every
    token with correct usage."""
    async with running_sim("tiny", kv_cache_tokens=256, max_model_len=256,
                           time_scale=0.2) as sim, openai.AsyncOpenAI(
            base_url=sim.url + "/v1", api_key="x", max_retries=0) as c:
        content = "x" * 152  # 3 + 4 + 38 = 45 prompt tokens; 45 + 100 = 145 each at the end
        results = await asyncio.gather(*(_stream_chat(c, 100, content) for _ in range(4)))
        metrics = await metric_values(sim.url)
        records = sim.engine.records()
        state = sim.engine.state()
    assert [u for _, _, u in results] == [100] * 4
    assert state["preemptions"] > 0
    assert metrics["vllm:num_preemptions_total"] == state["preemptions"]
    assert sum(r["preemptions"] for r in records) == state["preemptions"]
    assert all(r["completion_tokens"] == 100 and r["state"] == "finished" for r in records)
    assert all(len(r["chunks"]) == 100 for r in records)
    # the first admitted request is never the newest while others run: not preempted
    first = min(records, key=lambda r: r["admitted"])
    assert first["preemptions"] == 0
    assert state["kv_tokens_used"] == 0
    assert metrics["vllm:generation_tokens_total"] >= 400


def _gaps(chunks: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(chunks)]


async def test_itl_rises_with_batch_size() -> None:
    """Step time grows with the batch (per_seq_s): four together decode slower than one."""
    async with running_sim("tiny", per_seq_s=0.01, time_scale=0.5) as sim, \
            aiohttp.ClientSession() as s:
        url = sim.url + "/v1/chat/completions"

        async def one() -> None:
            async with s.post(url, json=chat_body(16)) as r:
                await r.read()

        await one()
        alone = statistics.median(_gaps(sim.engine.records()[-1]["chunks"]))
        await asyncio.gather(*(one() for _ in range(4)))
        batched = [statistics.median(_gaps(r["chunks"])) for r in sim.engine.records()[-4:]]
    # expected (scaled): alone ≈ (10 + 10·1) × 0.5 = 10 ms; batch 4 ≈ (10 + 10·4) × 0.5 = 25 ms
    assert min(batched) > alone * 1.6, (alone, batched)


async def test_itl_spikes_when_a_long_prompt_is_admitted() -> None:
    """Admitting a 1,000-token prompt costs 250 ms of prefill inside one step, which
    stalls the token stream of the request already running."""
    async with running_sim("tiny", time_scale=0.5) as sim, aiohttp.ClientSession() as s:
        url = sim.url + "/v1/chat/completions"
        running = asyncio.create_task(s.post(url, json=chat_body(60)))
        resp = await running
        count = 0
        async for line in resp.content:
            if b'"content":"' in line:
                count += 1
                if count == 10:
                    break
        async with s.post(url, json=chat_body(5, stream=False, content="y" * 3972)) as r:
            assert r.status == 200  # 3 + 4 + 993 = 1,000 prompt tokens
            await r.read()
        await resp.read()
        records = sim.engine.records()
    victim, long_req = records[-2], records[-1]
    assert long_req["prompt_tokens"] == 1000
    gaps = _gaps(victim["chunks"])
    worst = max(gaps)
    assert worst > 5 * statistics.median(gaps), (worst, statistics.median(gaps))
    assert worst > 0.1  # ≈ 250 ms × time_scale 0.5 of prefill plus the step
    # the stall is the step in which the long prompt was admitted (the step starts as the
    # previous one emits, a hair before the handler writes that chunk)
    i = gaps.index(worst)
    assert victim["chunks"][i] - 0.005 <= long_req["admitted"] <= victim["chunks"][i + 1]
