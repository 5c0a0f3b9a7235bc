"""End to end: clients (the openai SDK) → llmtop's proxy → ``llmtop sim``, observed by the
aggregator exactly as ``llmtop run`` wires it (bus pump, periodic ticks, live registry).

What the client received and what the simulator reports are the ground truth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from observed_support import observed_proxy

from llmtop.events import RequestRecord
from llmtop.sim.server import running_sim


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


async def chat(c: openai.AsyncOpenAI, user: str, max_tokens: int,
               on_chunk: Callable[[float], None] | None = None) -> tuple[int, float | None]:
    """One streamed chat; returns (completion tokens per the usage the client received,
    client-side TTFT)."""
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    stream = await c.chat.completions.create(
        model="sim-tiny", max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "tell me something"}],
        extra_headers={"X-LLMTOP-User": user},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            if on_chunk is not None:
                on_chunk(time.time())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens, ttft


async def test_system_and_per_user_tps_equal_what_clients_received() -> None:
    """Three users with 1, 2 and 3 concurrent streams for ~12 s."""
    loads = {"solo": 1, "pair": 2, "trio": 3}
    async with running_sim("tiny", seed=3, max_num_seqs=8) as sim, \
            observed_proxy(sim.url) as obs:
        c = client(obs.url)
        got: dict[str, int] = dict.fromkeys(loads, 0)
        chunk_times: dict[str, list[float]] = {u: [] for u in loads}
        stop_at = time.monotonic() + 12.0

        async def worker(user: str) -> None:
            while time.monotonic() < stop_at:
                n, _ = await chat(c, user, 40, chunk_times[user].append)
                got[user] += n

        workers = [asyncio.create_task(worker(u)) for u, n in loads.items() for _ in range(n)]
        await asyncio.sleep(9.0)
        # mid-run, streams open: live attribution must already count their tokens
        obs.agg.tick()
        mid = obs.agg.snapshot(60)
        t_mid = mid["time"]
        received_mid = sum(sum(1 for t in ts if t <= t_mid) for ts in chunk_times.values())
        await asyncio.gather(*workers)
        await c.close()
        await asyncio.sleep(0.1)  # the last records reach the aggregator
        end = obs.agg.snapshot(60)
        t_end = end["time"]

    assert mid["system"]["in_flight"] > 0
    assert mid["system"]["output_tokens"] == pytest.approx(received_mid, rel=0.02)
    total = sum(got.values())
    s = end["system"]
    assert s["output_tokens"] == total  # usage-based, exact
    assert s["requests"] == len(obs.records) and s["errors"] == 0
    elapsed = t_end - obs.t_created  # the aggregator has counted since then
    assert s["output_tps"] == pytest.approx(total / elapsed, rel=0.02)
    users = {u["user"]: u for u in end["users"]}
    for user in loads:
        assert users[user]["output_tps"] == pytest.approx(got[user] / elapsed, rel=0.02)
        assert users[user]["output_tokens"] == got[user]
    # and the split follows the load: 1 : 2 : 3 streams
    ratio = users["trio"]["output_tps"] / users["solo"]["output_tps"]
    assert 2.4 < ratio < 3.6


def hand_meets(r: RequestRecord, ttft_s: float, itl_p95_s: float) -> bool:
    """The SLO rule of shared/docs/domain.md, written out independently of llmtop.metrics."""
    if r.outcome != "ok" or r.ttft_s is None or r.ttft_s > ttft_s:
        return False
    samples: list[float] = []
    for i in range(1, len(r.chunk_offsets_s)):
        k = r.chunk_tokens[i]
        gap = r.chunk_offsets_s[i] - r.chunk_offsets_s[i - 1]
        samples += [gap / k] * k
    if not samples:
        return True
    samples.sort()
    rank = max(int(0.95 * len(samples) + 0.5), 1)
    return samples[rank - 1] <= itl_p95_s


async def sim_state(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/sim/state") as r:
        out: dict[str, Any] = await r.json()
        return out


async def test_saturated_in_flight_matches_the_engine_and_goodput_the_records() -> None:
    """Ten streams on four sequence slots: the proxy's waiting = the engine's queue; then
    attainment and goodput equal a hand computation over the recorded requests."""
    async with running_sim("tiny", seed=4) as sim, \
            observed_proxy(sim.url, **{"slo.ttft_s": 0.3, "slo.itl_p95_s": 0.05}) as obs, \
            aiohttp.ClientSession() as s:
        c = client(obs.url)
        tasks = [asyncio.create_task(chat(c, "ann" if i % 2 else "ben", 60)) for i in range(10)]
        matches = 0
        for _ in range(40):
            await asyncio.sleep(0.05)
            before = await sim_state(s, sim.url)
            snap = obs.agg.snapshot(10)["system"]
            after = await sim_state(s, sim.url)
            if before["running"] + before["waiting"] < 10 or \
                    (before["running"], before["waiting"]) != (after["running"], after["waiting"]):
                continue  # still arriving, or the engine moved while we looked
            assert before["running"] == 4 and before["waiting"] == 6
            assert snap["in_flight"] == 10
            if snap["waiting"] == before["waiting"]:
                assert snap["streaming"] == before["running"]
                matches += 1
                if matches >= 3:
                    break
        assert matches >= 3, "never saw the proxy's waiting equal the engine's queue"
        await asyncio.gather(*tasks)
        await c.close()
        await asyncio.sleep(0.1)
        snap = obs.agg.snapshot(None)

    recs = obs.records
    assert len(recs) == 10
    met = [r for r in recs if hand_meets(r, 0.3, 0.05)]
    assert 0 < len(met) < 10  # some queued long enough to miss the TTFT objective
    s_ = snap["system"]
    assert s_["slo_met"] == len(met)
    assert s_["slo_attainment"] == pytest.approx(len(met) / 10)
    span = s_["span_s"]
    assert s_["goodput_rps"] == pytest.approx(len(met) / span)
    assert s_["goodput_tps"] == pytest.approx(sum(r.completion_tokens or 0 for r in met) / span)
    users = {u["user"]: u for u in snap["users"]}
    for name in ("ann", "ben"):
        mine = [r for r in recs if r.user == name]
        mine_met = [r for r in mine if hand_meets(r, 0.3, 0.05)]
        assert users[name]["requests"] == len(mine)
        assert users[name]["slo_attainment"] == pytest.approx(len(mine_met) / len(mine))


SLO_TTFT_S = 0.15
TARGET = 0.85
"""Unstalled, levels 1-4 meet the objective 100 %, 5 74 %, 6 48 %: 85 % tells them apart and
lets a level of 26 requests lose 3 to a freeze of the machine (every request in flight then
misses 150 ms; at 95 % the two of level 2 failed it: 93 %)."""
LEVELS = range(1, 17)
ANSWER_TOKENS = 12


def per_level(level: int) -> int:
    """Requests per level: enough for a capacity bin (20) up to 8; past the knee fewer do
    (those bins never qualify, and the walk has stopped before them anyway)."""
    return 26 if level <= 8 else 10


async def light_chat(s: aiohttp.ClientSession, url: str) -> float | None:
    """One streamed chat read with plain aiohttp (the load generator's own CPU must stay
    small next to the engine's queueing); returns the client-side TTFT."""
    body = {"model": "sim-tiny", "stream": True, "max_tokens": ANSWER_TOKENS,
            "messages": [{"role": "user", "content": "tell me something"}]}
    t0 = time.perf_counter()
    ttft = None
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {") and b'"content":"' in line:
                ttft = time.perf_counter() - t0
    return ttft


async def step_load(url: str, ttfts: dict[int, list[float]]) -> None:
    """A closed-loop load that adds one concurrent stream per level, 1 … 16, and stays at
    each level for ``per_level(level)`` finished requests. TTFTs are filed by the level their
    request started in."""
    level = 0
    done_at_level = 0
    changed = asyncio.Event()
    stop = False

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal done_at_level
        while not stop:
            started_level = level
            ttft = await light_chat(s, url)
            ttfts.setdefault(started_level, []).append(ttft if ttft is not None else 1e9)
            done_at_level += 1
            if done_at_level >= per_level(level):
                changed.set()

    async with aiohttp.ClientSession() as s:
        workers = []
        for lvl in LEVELS:
            level, done_at_level = lvl, 0
            changed.clear()
            workers.append(asyncio.create_task(worker(s)))
            await changed.wait()
        stop = True
        await asyncio.gather(*workers)


def knee(ttfts: dict[int, list[float]]) -> int:
    """The largest level before the first one whose attainment misses the target."""
    best = 0
    for lvl in LEVELS:
        xs = ttfts.get(lvl, [])
        if len(xs) < 20:
            continue
        if sum(1 for x in xs if x <= SLO_TTFT_S) / len(xs) < TARGET:
            break
        best = lvl
    return best


@pytest.mark.slow
async def test_capacity_at_slo_lands_within_one_step_of_the_true_knee() -> None:
    """The tiny profile (4 sequence slots), 12-token answers, TTFT objective 150 ms: past
    four streams requests queue for a slot (up to a whole answer, ~200 ms). The true knee is
    the one the clients saw, by their own clocks, stepping a load through the proxy; the
    live estimate is llmtop's from the same requests. (The truth used to come from a second
    run straight at the simulator: a freeze of the machine during one run and not the other,
    holding the two requests of level 2 past 150 ms, moved one knee and not the other. In
    one run, a freeze holds the same requests for both.)"""
    async with running_sim("tiny", seed=5) as sim, \
            observed_proxy(sim.url, **{"slo.ttft_s": SLO_TTFT_S, "slo.itl_p95_s": None,
                                       "slo.target": TARGET}) as obs:
        seen: dict[int, list[float]] = {}
        await step_load(obs.url, seen)
        await asyncio.sleep(0.1)
        cap = obs.agg.snapshot(None)["capacity"]
    true_knee = knee(seen)
    share = {lvl: round(sum(x <= SLO_TTFT_S for x in xs) / len(xs), 2)
             for lvl, xs in sorted(seen.items()) if xs}
    live = {b["concurrency"]: f"{b['met']}/{b['requests']}" for b in cap["bins"]}
    print(f"\ntrue knee {true_knee}, live estimate {cap['max_concurrency_at_slo']}; "
          f"attainment by level as the clients saw it {share}; met/requests by concurrency "
          f"at start as the proxy saw it {live}")
    assert 2 <= true_knee < 16  # the load really crossed the knee
    assert cap["max_concurrency_at_slo"] is not None
    assert abs(cap["max_concurrency_at_slo"] - true_knee) <= 1
    assert cap["goodput_tps_at_slo"] is not None and cap["goodput_tps_at_slo"] > 0
