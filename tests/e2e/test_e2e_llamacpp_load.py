"""A real llama.cpp server under load, through ``llmtop run --headless``: queueing in its
four slots, a client that walks away mid-generation, and the engine panel's data."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise
from typing import Any

import aiohttp
from e2e_support import (
    CHAT,
    ENGINE_INTERVAL_S,
    MODEL,
    USER_HEADER,
    ClientRun,
    LlmtopProcess,
    engine_metrics,
    new_user,
    openai_client,
    sdk_stream,
    wait_engine_idle,
)

SLOTS = 4
REQUESTS = 12
STAGGER_S = 0.03
"""Requests are sent this far apart (the engine still decides whom it serves first)."""


async def test_twelve_requests_into_four_slots_queue_for_real(
    engine: Any, llmtop: LlmtopProcess
) -> None:
    """12 concurrent requests into 4 slots: llama.cpp defers 8, llmtop's snapshot shows them
    waiting, the requests served later have larger TTFT (three waves of four), and the engine's
    ``requests_deferred``/``requests_processing`` as llmtop scraped them agree with the
    proxy's own waiting/streaming counts within one scrape interval."""
    samples: list[tuple[float, int, int, float | None, float | None]] = []
    done = asyncio.Event()

    direct: list[tuple[float, float, float]] = []  # llama.cpp's /metrics, polled by us

    async def sample(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            snap = await llmtop.snapshot(session, "10")
            system, eng = snap["system"], snap["engine"]
            samples.append(
                (time.monotonic(), system["waiting"], system["streaming"],
                 eng["running"], eng["waiting"])
            )  # fmt: skip
            m = await engine_metrics(session, engine.url)
            direct.append(
                (time.monotonic(), m["llamacpp:requests_processing"],
                 m["llamacpp:requests_deferred"])
            )  # fmt: skip
            await asyncio.sleep(0.03)

    users = [new_user(f"queue{i:02d}") for i in range(REQUESTS)]

    async def one(client: Any, i: int) -> ClientRun:
        await asyncio.sleep(i * STAGGER_S)
        # ignore_eos (llama.cpp): every request generates exactly max_tokens, so waves are even
        return await sdk_stream(
            client, "chat", user=users[i], max_tokens=32, extra_body={"ignore_eos": True},
            prompt=f"Tell me fact number {i + 1} about the moon.",
        )  # fmt: skip

    async with aiohttp.ClientSession() as session, openai_client(llmtop.proxy_url) as client:
        await wait_engine_idle(session, engine.url)
        sampler = asyncio.create_task(sample(session))
        runs = await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))
        await asyncio.sleep(3 * ENGINE_INTERVAL_S)  # the scrape after the last request
        done.set()
        await sampler
    records = await llmtop.records_for(users)

    assert all(r["outcome"] == "ok" and r["completion_tokens"] == 32 for r in records)
    assert all(len(run.chunk_times) == 32 for run in runs)
    # the snapshot shows requests waiting, and the engine's own metrics agree there was a queue
    assert max(s[1] for s in samples) >= SLOTS, samples
    assert max(s[3] or 0 for s in samples) == SLOTS, samples
    assert max(s[4] or 0 for s in samples) >= SLOTS, samples
    # three waves of four: whoever the engine served first, each later wave waited for a
    # whole earlier wave to finish, so sorted TTFTs jump by about one generation time twice
    ttft = sorted(r["ttft_s"] for r in records)
    gen = sorted(r["e2e_s"] - r["ttft_s"] for r in records)[0]
    print(f"ttft sorted (s): {[round(t, 2) for t in ttft]}; shortest generation {gen:.2f} s")
    assert ttft[4] - ttft[3] > 0.25 * gen, (ttft, gen)
    assert ttft[8] - ttft[7] > 0.25 * gen, (ttft, gen)
    assert ttft[8] > ttft[4] > ttft[0]
    # (1) llmtop's scraped engine readings are llama.cpp's own figures, at most one scrape
    # interval old: each equals what we read from its /metrics within that window (a
    # reading can fall between two of our polls only when the state changed right then).
    window = ENGINE_INTERVAL_S + 0.3  # + our polling period and a scrape's own latency
    # When the engine's state moved between two of our polls, llmtop's scrape can catch a
    # moment we never saw (a wave's release passes through (3, 4) in a few ms): such a reading
    # lies between the two polls, each count within the pair's range.
    readings = [(t, r, w) for t, _pw, _ps, r, w in samples if r is not None and w is not None]
    polls = list(pairwise(direct))
    stale = [
        (round(t - samples[0][0], 2), r, w)
        for t, r, w in readings
        if not any(t - window <= t2 <= t + 0.05 and (r, w) == (r2, w2) for t2, r2, w2 in direct)
        and not any(
            t - window <= b[0] and a[0] <= t + 0.05
            and min(a[1], b[1]) <= r <= max(a[1], b[1])
            and min(a[2], b[2]) <= w <= max(a[2], b[2])
            for a, b in polls
        )
    ]  # fmt: skip
    # (2) against llmtop's own counts. A request in prefill is "processing" to llama.cpp but
    # still "waiting" (no first token) to llmtop, and llama.cpp counts a request as deferred
    # only once its scheduler has looked at it (not while it evaluates a prompt batch), so
    # at a moment within the window: streaming <= running, waiting >= deferred and in
    # flight >= running + deferred; and once the running requests have their first token,
    # the split is the same: (streaming, waiting) = (running, deferred) with 8 queued.
    # The engine's moment can fall between two of our samples while the proxy's counts moved
    # (a wave's four streams can all end within one 30 ms poll while the engine, mid-release,
    # reports 3), so each condition may hold at either end of a pair of consecutive samples.
    pairs = list(pairwise(samples))
    broken = [
        (round(t - samples[0][0], 2), r, w)
        for t, r, w in readings
        if not any(
            t - window <= b[0] and a[0] <= t + 0.05
            and min(a[2], b[2]) <= r
            and max(a[1], b[1]) >= w
            and max(a[1] + a[2], b[1] + b[2]) >= r + w
            for a, b in pairs
        )
    ]  # fmt: skip
    exact = [s for s in samples if (s[2], s[1]) == (s[3], s[4]) and s[1] >= 2 * SLOTS]
    print(f"engine vs llmtop: {len(readings)} readings, {len(stale)} not seen at the engine "
          f"within {window:.2f} s (nor between two polls) {stale[:10]}, "
          f"{len(broken)} inconsistent with the proxy's counts {broken[:10]}, "
          f"{len(exact)} with the same split and 8 queued")  # fmt: skip
    assert len(stale) <= len(readings) // 20, stale
    assert not broken, broken
    assert exact, "llmtop's waiting never equalled llama.cpp's deferred queue"


async def test_a_client_that_disconnects_frees_its_slot(engine: Any, llmtop: LlmtopProcess) -> None:
    """A client that closes its stream mid-generation: llama.cpp stops generating for it (its
    slot frees long before max_tokens could be produced) and llmtop records it cancelled."""
    max_tokens = 1800
    user = new_user("gone")
    async with aiohttp.ClientSession() as session, openai_client(llmtop.proxy_url) as client:
        before = await wait_engine_idle(session, engine.url)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,  # type: ignore[arg-type]
            stream=True,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
            extra_headers={USER_HEADER: user},
        )
        seen = 0
        async for chunk in stream:
            seen += sum(1 for c in chunk.choices if c.delta.content)
            if seen >= 5:
                break
        busy = await engine_metrics(session, engine.url)
        assert busy["llamacpp:requests_processing"] == 1
        closed_at = time.monotonic()
        await stream.close()
        idle = await wait_engine_idle(session, engine.url, timeout_s=10)
        freed_s = time.monotonic() - closed_at
        await asyncio.sleep(0.5)
        later = await engine_metrics(session, engine.url)
        async with session.get(f"{engine.url}/slots") as resp:
            slots = await resp.json()
    decoded = idle["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"]
    print(f"slot freed {freed_s * 1e3:.0f} ms after the client closed; {decoded:.0f} decode steps")
    assert decoded < max_tokens / 2, "llama.cpp kept generating for a client that had left"
    assert later["llamacpp:n_decode_total"] == idle["llamacpp:n_decode_total"]
    assert not any(s.get("is_processing") for s in slots), slots
    (rec,) = await llmtop.records_for([user])
    assert rec["outcome"] == "cancelled", rec


async def test_snapshot_carries_the_engines_own_readings(
    engine: Any, llmtop: LlmtopProcess
) -> None:
    """The engine panel's data: kind ``llamacpp``, running and waiting as llama.cpp reports
    them, and KV-cache usage ``null`` because this llama.cpp version does not export it."""
    async with aiohttp.ClientSession() as session:
        metrics = await wait_engine_idle(session, engine.url)
        await asyncio.sleep(3 * ENGINE_INTERVAL_S)
        snap = await llmtop.snapshot(session)
    assert "llamacpp:kv_cache_usage_ratio" not in metrics
    eng = snap["engine"]
    assert eng["kind"] == "llamacpp"
    assert eng["running"] == metrics["llamacpp:requests_processing"] == 0
    assert eng["waiting"] == metrics["llamacpp:requests_deferred"] == 0
    assert eng["kv_cache_usage"] is None
