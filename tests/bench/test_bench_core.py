"""llmtop bench against the simulator: the knee, open loop vs closed loop, usage-based tokens,
agreement with and without the proxy, and vLLM's benchmark definitions on the same records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp import web

from llmtop.bench.client import BenchClient
from llmtop.bench.loadgen import run_closed, run_open
from llmtop.bench.search import search
from llmtop.bench.summary import StepSummary, summarize
from llmtop.bench.workload import Length, Workload
from llmtop.bus import EventBus
from llmtop.config import Config, load_config
from llmtop.events import RequestRecord
from llmtop.proxy.server import ProxyServer
from llmtop.sim.profiles import get_profile
from llmtop.sim.server import running_sim


def cfg(**kw: object) -> Config:
    return load_config(None, env={}, overrides=dict(kw))


def workload(prompt: int = 32, out: int = 24) -> Workload:
    return Workload(prompt_tokens=Length(prompt, prompt), max_tokens=Length(out, out), seed=1)


async def test_search_finds_the_simulators_knee() -> None:
    """--search lands within one step of the analytic capacity (max_num_seqs = 4 here:
    every request past it waits ~a request's duration, 450+ ms, over the TTFT SLO).
    Below the knee TTFT is 23-62 ms: the SLO of 250 ms leaves room for a slow moment of the
    shared machine, where 120 ms failed level 1 in one CI run (one request of its 8 at
    168 ms, and nothing met the target). A longer freeze puts every request in flight over
    any SLO that still tells the knee apart, so the target leaves room for one: 85 % lets
    level 1 miss 1 of its 8, level 2 2 of 14, and level 4, missing 4 of 24 (83 %), is
    bisected to 3, within one of the knee; 95 % failed level 1 on one frozen request.
    Unstalled: 1, 2, 4 at 100 %; 5 at 78 %, 6 at 58 %, 8 at 17 % (a freeze only lowers
    them), so the search still stops at 4."""
    c = cfg(**{"slo.ttft_s": 0.25, "slo.itl_p95_s": 0.05})
    async with running_sim("tiny", seed=3) as sim:
        prof = get_profile("tiny")
        client = BenchClient(sim.url)
        wl = workload()

        async def level(n: float) -> StepSummary:
            run = await run_closed(client, wl, int(n), duration_s=2.5, warmup_s=0.5)
            return summarize(run, c)

        result = await search(level, integer=True, start_levels=[1, 2, 4, 8], target=0.85,
                              max_level=16)
    assert result.best is not None
    knee = prof.max_num_seqs
    assert abs(result.best.level - knee) <= 1, [(s.level, s.slo_attainment)
                                               for s in result.ordered()]
    assert result.first_fail is not None and result.first_fail.level > result.best.level


async def test_tokens_come_from_usage_not_chunks() -> None:
    """With 4 tokens per chunk, TPS counts tokens (usage), not chunks."""
    async with running_sim("tiny", tokens_per_chunk=4) as sim:
        run = await run_closed(BenchClient(sim.url), workload(out=32), 2, requests=6)
    s = summarize(run, cfg())
    assert all(r.completion_tokens == 32 for r in run.records)
    assert all(r.token_source == "usage" for r in run.records)
    # ~8 chunks of 4 tokens (the prefill step's first token may come alone; a read may
    # carry two chunks): far fewer chunks than tokens, and the counts add up to usage
    assert all(sum(r.chunk_tokens) == 32 and len(r.chunk_offsets_s) <= 9 for r in run.records)
    assert s.output_tps == pytest.approx(sum(r.completion_tokens or 0 for r in run.records)
                                         / run.duration_s)
    # ITL spreads each 4-token chunk over its tokens: mean ITL ≈ TPOT, exactly a sample per
    # token after the first chunk summing to the chunks' span, TPOT that span plus the tail
    # after the last chunk over n - 1 (the means within 15 % failed when the machine paused
    # in one record's tail: TPOT alone counts it)
    for r in run.records:
        itl, tpot = r.itl_samples_s(), r.tpot_s()
        span = r.chunk_offsets_s[-1] - r.chunk_offsets_s[0]
        assert tpot is not None and len(itl) == 32 - r.chunk_tokens[0]
        assert sum(itl) == pytest.approx(span)
        assert tpot * 31 == pytest.approx(span + (r.e2e_s - r.chunk_offsets_s[-1]))


class StallingUpstream:
    """An OpenAI-style upstream that answers in 20 ms, except that every request arriving
    during [stall_from, stall_from + stall_s) is held until the stall ends (a GC pause,
    a stuck scheduler)."""

    def __init__(self, stall_from: float, stall_s: float) -> None:
        self.t0 = 0.0
        self.stall_from = stall_from
        self.stall_s = stall_s
        self.held = 0
        """Requests held by the stall."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        loop = asyncio.get_running_loop()
        now = loop.time() - self.t0
        if self.stall_from <= now < self.stall_from + self.stall_s:
            self.held += 1
            await asyncio.sleep(self.stall_from + self.stall_s - now)
        await asyncio.sleep(0.02)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for text in ("a", "b"):
            await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
                             % text.encode())
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,'
                         b'"completion_tokens":2}}\n\ndata: [DONE]\n\n')
        return resp


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_open_loop_sees_a_stall_that_closed_loop_hides() -> None:
    """A 1 s stall: the open loop (20 req/s, measured from scheduled times) shows it in
    every request scheduled during it; a closed loop of one client shows one slow request,
    so its p90 hides the stall (coordinated omission).

    The closed loop's one request in the stall is counted where it cannot be mistaken: the
    upstream held one request, and the client saw at most one wait over 0.7 s (the held one
    waits ~1 s). A freeze of the test process (client and upstream share it) makes the
    request in flight slow too, so 'at most two over 0.3 s' failed on two 0.4 s freezes in
    the closed loop's 3 s; a 0.2-0.6 s freeze stays under 0.7 s."""
    async def measure(open_loop: bool) -> tuple[list[RequestRecord], int]:
        up = StallingUpstream(stall_from=1.0, stall_s=1.0)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", up.handle)
        async for url in serve(app):
            up.t0 = asyncio.get_running_loop().time()
            client = BenchClient(url)
            if open_loop:
                run = await run_open(client, workload(), 20.0, duration_s=3.0, poisson=False)
            else:
                run = await run_closed(client, workload(), 1, duration_s=3.0)
            return run.records, up.held
        raise AssertionError("unreachable")

    opened, _ = await measure(True)
    closed, held_closed = await measure(False)
    slow_open = [r for r in opened if (r.ttft_s or 0) > 0.3]
    assert len(slow_open) >= 12, f"open loop saw {len(slow_open)} stalled requests"
    assert held_closed == 1  # one client: one request in the stall
    assert sum((r.ttft_s or 0) > 0.7 for r in closed) <= 1
    # the closed loop's tail looks healthy; the open loop's does not
    p90_closed = float(np.percentile([r.ttft_s or 0 for r in closed], 90))
    p90_open = float(np.percentile([r.ttft_s or 0 for r in opened], 90))
    assert p90_closed < 0.1 < 0.3 < p90_open


async def test_with_and_without_proxy_agree() -> None:
    """The same closed-loop level, direct and through the proxy: TTFT p50 differs by no
    more than the proxy's overhead (≪ 5 ms), tokens identically. One client, so every
    request meets an idle engine (the simulator's step phase still adds ±7 ms to each
    TTFT, hence 40 requests and the median)."""
    async with running_sim("tiny") as sim:
        direct = await run_closed(BenchClient(sim.url), workload(out=4), 1, requests=40)
        c = cfg(upstream=sim.url, listen="127.0.0.1:0")
        proxy = ProxyServer(c, EventBus())
        url = await proxy.start()
        try:
            via = await run_closed(BenchClient(url), workload(out=4), 1, requests=40)
        finally:
            await proxy.shutdown(1.0)
    a, b = summarize(direct, cfg()), summarize(via, cfg())
    ttft_a, ttft_b = a.latency["ttft"]["p50"], b.latency["ttft"]["p50"]
    assert ttft_a is not None and ttft_b is not None
    assert abs(ttft_b - ttft_a) < 0.005, (ttft_a, ttft_b)
    assert {r.completion_tokens for r in direct.records} == {r.completion_tokens
                                                            for r in via.records} == {4}


def interpolated_between(values: list[float], q: float) -> tuple[float, float]:
    """The two order statistics np.percentile(values, q) interpolates between. HDR's rank
    rule reports one of them (to 3 significant digits); where they lie apart, as one stalled
    request puts them, the interpolated figure is neither."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    return v[int(np.floor(pos))], v[int(np.ceil(pos))]


async def test_vllm_benchmark_definitions_agree_on_the_same_records() -> None:
    """vLLM's vllm/benchmarks/serve.py, applied by hand to our records: TTFT is the first
    content chunk minus the send time, TPOT is (latency − ttft)/(output_len − 1) with
    latency at the last content chunk, ITL is every gap between consecutive chunks, all
    summarised with np.percentile. Ours agree within HDR's 3 significant digits, except
    ITL, which we spread over the tokens of multi-token chunks on purpose: with 2 tokens
    per chunk vLLM's ITL is exactly twice ours, and ours matches TPOT."""
    async with running_sim("tiny", tokens_per_chunk=2) as sim:
        run = await run_closed(BenchClient(sim.url), workload(out=24), 3, requests=24)
    recs = [r for r in run.records if r.outcome == "ok"]
    s = summarize(run, cfg())
    ttfts = [r.chunk_offsets_s[0] for r in recs]
    v_tpot = [(r.chunk_offsets_s[-1] - r.chunk_offsets_s[0]) / ((r.completion_tokens or 0) - 1)
              for r in recs]
    v_itl = [g for r in recs for g in r.chunk_gaps_s()]
    ours_itl = [x for r in recs for x in r.itl_samples_s()]
    for q in (50, 99):
        lo, hi = interpolated_between(ttfts, q)
        assert lo * (1 - 2e-3) <= s.latency["ttft"][f"p{q}"] <= hi * (1 + 2e-3), (q, lo, hi)
    # our E2E ends with the last byte (usage chunk, [DONE]); vLLM's latency with the last
    # content chunk: the difference is the time after the last content chunk, spread over
    # the n - 1 tokens (a few ms unstalled, but the length of a stall that falls there: a
    # 5 % bound on the means failed when one did)
    for r, v in zip(recs, v_tpot, strict=True):
        n = r.completion_tokens or 0
        tail = (r.e2e_s - r.chunk_offsets_s[-1]) / (n - 1)
        assert r.tpot_s() == pytest.approx(v + tail, rel=1e-9, abs=1e-12), r.id
    # same time, counted per chunk (vLLM) or per token (ours): the ratio of the means is the
    # mean tokens per chunk — 2 here, a little more where a read carried two chunks
    assert sum(ours_itl) == pytest.approx(sum(v_itl), rel=1e-9)
    per_chunk = sum(sum(r.chunk_tokens[1:]) for r in recs) / len(v_itl)
    assert float(np.mean(v_itl)) == pytest.approx(per_chunk * float(np.mean(ours_itl)), rel=1e-6)
    assert 1.7 <= per_chunk <= 2.5
    assert float(np.mean(ours_itl)) == pytest.approx(float(np.mean(v_tpot)), rel=0.05)
