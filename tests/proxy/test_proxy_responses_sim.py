"""``/v1/responses`` through the proxy with the openai SDK against ``llmtop sim``: the
bytes pass through exactly, and what the proxy records (TTFT, chunk times, tokens) agrees
with the simulator's ground truth (``/sim/requests``) and with what the client saw —
``client.responses.create(stream=True)`` async and sync, the ``client.responses.stream``
helper, a non-streamed answer, cancellation and faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
from aiohttp import web
from test_proxy_support import running_proxy

from llmtop.sim.server import running_sim

RESP = "/v1/responses"
FAST = {"time_scale": 0.3}
CLOCK_SLACK_S = 0.005
"""Wall-clock readings of the proxy (``t_start`` + offsets), the simulator and the client
are compared for order only: the proxy's wall anchor may be off by this much."""
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


async def _truth(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(url + "/sim/requests") as r:
        out: list[dict[str, Any]] = await r.json()
        return out


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-resp", max_retries=0)


@asynccontextmanager
async def _tee(upstream: str) -> AsyncIterator[tuple[str, list[bytearray]]]:
    """A pass-through between the proxy and the simulator that keeps every response body
    as the simulator sent it."""
    bodies: list[bytearray] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with session.request(request.method, upstream + request.path_qs,
                                   data=await request.read(), headers=headers) as up:
            kept = bytearray()
            bodies.append(kept)
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in _HOP})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                kept += data
                await resp.write(data)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", bodies
    finally:
        await runner.cleanup()
        await session.close()


async def test_async_sdk_stream_passes_through_byte_exact() -> None:
    async with running_sim("tiny", seed=11, **FAST) as sim, _tee(sim.url) as (tee, bodies), \
            running_proxy(tee) as (_, url, recs), _client(url) as c:
        stream = await c.responses.create(model="m", input="hello", max_output_tokens=12,
                                          stream=True)
        events = [e async for e in stream]
        async with c.responses.with_streaming_response.create(
                model="m", input="hello", max_output_tokens=7, stream=True) as raw:
            got = b"".join([b async for b in raw.iter_bytes()])
        records = await recs.wait(2)
        truth = await _truth(sim.url)
    assert got == bytes(bodies[1]) and got.count(b"event: response.output_text.delta") == 7
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 12 and events[-1].type == "response.incomplete"
    usage = events[-1].response.usage
    assert usage is not None and usage.output_tokens == 12
    for rec, t in zip(records, truth, strict=True):
        assert rec.dialect == "openai" and rec.path == RESP and rec.stream is True
        assert rec.outcome == "ok" and rec.token_source == "usage"
        assert rec.completion_tokens == t["completion_tokens"] == sum(rec.chunk_tokens)
        assert rec.prompt_tokens == t["prompt_tokens"]
        assert rec.user.startswith("key:")


async def test_timings_agree_with_the_engine_and_the_client() -> None:
    """The request waits for a slot behind another (``max_num_seqs=1``): its
    ``response.created`` arrives at once, yet TTFT runs to the first text delta. Every
    content chunk the proxy timed was written by the engine before and read by the client
    after; tokens are the engine's."""
    async with running_sim("tiny", seed=12, max_num_seqs=1, **FAST) as sim, \
            running_proxy(sim.url) as (_, url, recs), _client(url) as c:
        blocker = await c.responses.create(model="m", input="x", max_output_tokens=100,
                                           stream=True)
        it = blocker.__aiter__()
        while (await it.__anext__()).type != "response.output_text.delta":
            pass
        stream = await c.responses.create(model="m", input="measured", max_output_tokens=9,
                                          stream=True)
        seen: list[tuple[str, float]] = []
        async for e in stream:
            seen.append((e.type, time.time()))
        async for _ in it:
            pass
        records = await recs.wait(2)
        truth = await _truth(sim.url)
    rec = next(r for r in records if r.completion_tokens == 9)
    t = truth[1]
    assert rec.outcome == "ok" and t["completion_tokens"] == 9 and rec.token_source == "usage"
    assert seen[0][0] == "response.created"
    created_at = seen[0][1]
    first_delta = next(ts for typ, ts in seen if typ == "response.output_text.delta")
    assert rec.ttft_s is not None
    proxy_first = rec.t_start + rec.ttft_s
    # the created event came before the engine's first token: it did not start TTFT
    assert created_at < t["chunks"][0]
    assert t["chunks"][0] - CLOCK_SLACK_S <= proxy_first <= first_delta + CLOCK_SLACK_S
    assert 1 <= len(rec.chunk_offsets_s) <= len(t["chunks"]) and sum(rec.chunk_tokens) == 9
    # chunk i (k tokens so far, one a delta) went out after the engine wrote its i-th
    # delta and before the client read its k-th
    client_times = [ts for typ, ts in seen if typ == "response.output_text.delta"]
    assert len(client_times) == 9
    k = 0
    for i, (off, tokens) in enumerate(zip(rec.chunk_offsets_s, rec.chunk_tokens,
                                          strict=True)):
        k += tokens
        at = rec.t_start + off
        assert t["chunks"][i] - CLOCK_SLACK_S <= at <= client_times[k - 1] + CLOCK_SLACK_S


async def test_sync_sdk_stream_and_whole_answer() -> None:
    async with running_sim("tiny", seed=13, **FAST) as sim, \
            running_proxy(sim.url) as (_, url, recs):
        def work() -> tuple[str, int, str, int]:
            with openai.OpenAI(base_url=url + "/v1", api_key="sk-sync", max_retries=0) as c:
                stream = c.responses.create(model="m", input="hi", max_output_tokens=8,
                                            stream=True)
                text, out = "", 0
                for e in stream:
                    if e.type == "response.output_text.delta":
                        text += e.delta
                    elif e.type == "response.incomplete" and e.response.usage is not None:
                        out = e.response.usage.output_tokens
                whole = c.responses.create(model="m", input="hi", max_output_tokens=5)
                assert whole.usage is not None
                return text, out, whole.output_text, whole.usage.output_tokens

        text, out, whole_text, whole_out = await asyncio.to_thread(work)
        records = await recs.wait(2)
        truth = await _truth(sim.url)
    assert text.strip() and whole_text.strip() and (out, whole_out) == (8, 5)
    assert [r.stream for r in records] == [True, False]
    assert [r.completion_tokens for r in records] == [8, 5] == [
        t["completion_tokens"] for t in truth]
    assert all(r.outcome == "ok" and r.token_source == "usage" for r in records)
    assert records[0].ttft_s is not None and len(records[0].chunk_offsets_s) >= 1
    assert records[1].chunk_tokens == (5,)


async def test_stream_helper_with_a_named_user() -> None:
    """``client.responses.stream`` (the SDK's accumulating helper) through the proxy; the
    request's ``user`` names the user, as a chat request's does."""
    async with running_sim("tiny", seed=14, output_tokens_dist="fixed", output_tokens_mean=6,
                           **FAST) as sim, running_proxy(sim.url) as (_, url, recs), \
            _client(url) as c:
        async with c.responses.stream(model="m", input="hi", user="alice") as st:
            deltas = [e.delta async for e in st if e.type == "response.output_text.delta"]
            final = await st.get_final_response()
        (rec,) = await recs.wait(1)
        (t,) = await _truth(sim.url)
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == 6
    assert rec.user == "alice" and rec.outcome == "ok" and rec.model == "m"
    assert rec.completion_tokens == 6 == t["completion_tokens"]
    assert rec.prompt_tokens == final.usage.input_tokens == t["prompt_tokens"]


async def test_client_leaving_is_cancelled_in_the_record_and_the_engine() -> None:
    async with running_sim("tiny", seed=15) as sim, \
            running_proxy(sim.url) as (_, url, recs), _client(url) as c:
        stream = await c.responses.create(model="m", input="x", max_output_tokens=500,
                                          stream=True)
        n = 0
        async for e in stream:
            n += e.type == "response.output_text.delta"
            if n == 5:
                break
        await stream.close()
        (rec,) = await recs.wait(1)
        for _ in range(200):
            (t,) = await _truth(sim.url)
            if t["cancelled_at"] is not None:
                break
            await asyncio.sleep(0.005)
    assert rec.outcome == "cancelled" and rec.error == "client disconnected"
    assert rec.ttft_s is not None and sum(rec.chunk_tokens) >= 5
    assert t["state"] == "cancelled" and t["completion_tokens"] < 500


async def test_faults_become_the_right_outcomes() -> None:
    async with running_sim("tiny", seed=16, **FAST) as sim, \
            running_proxy(sim.url) as (_, url, recs), aiohttp.ClientSession() as s:
        body = {"model": "m", "input": "x", "max_output_tokens": 6, "stream": True}
        async with s.post(url + RESP, json=body,
                          headers={"X-Sim-Fault": "malformed-after:2"}) as r:
            assert r.status == 200 and (await r.read()).endswith(b"}\n\n")
        async with s.post(url + RESP, json=body, headers={"X-Sim-Fault": "status:429"}) as r:
            assert r.status == 429
        records = await recs.wait(2)
    assert records[0].outcome == "error" and "malformed" in (records[0].error or "")
    assert records[0].completion_tokens == 6  # the engine's usage still came
    assert records[1].outcome == "error" and records[1].status == 429
