"""Demo traffic: three users of different weight, concurrency ramping from 1 to past the
engine's capacity and back, in cycles — so latency, queueing, saturation warnings and the
capacity estimate all move on screen.

Closed loop on purpose (this is a demo, not a measurement: ``llmtop bench`` has the
open-loop generator). Stops by itself after ``duration_s`` when given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

USERS: tuple[tuple[str, float], ...] = (("alice", 0.5), ("bob", 0.3), ("carol", 0.2))
FAILURE_BACKOFF_S = 0.5
"""A worker's pause after a failed request (error status or connection error)."""
WORDS = ("tokens", "latency", "cache", "batch", "decode", "prefill", "memory", "queue")


@dataclass
class RampPlan:
    """Concurrency over time: a triangle 1 → peak → 1 every ``period_s``."""

    peak: int = 16
    period_s: float = 120.0
    floor: int = 1

    def concurrency_at(self, t: float) -> int:
        phase = (t % self.period_s) / self.period_s
        tri = 1.0 - abs(2.0 * phase - 1.0)  # 0 → 1 → 0
        return max(self.floor, round(self.floor + tri * (self.peak - self.floor)))


@dataclass
class DriverStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    by_user: dict[str, int] = field(default_factory=dict)


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _one_request(
    session: aiohttp.ClientSession, url: str, rng: random.Random, stats: DriverStats
) -> None:
    r = rng.random()
    acc = 0.0
    user = USERS[-1][0]
    for name, w in USERS:
        acc += w
        if r < acc:
            user = name
            break
    long_prompt = rng.random() < 0.05
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": _prompt(rng, 600 if long_prompt else 40)}],
        "max_tokens": rng.randint(32, 160),
        "stream": True,
    }
    stats.sent += 1
    stats.by_user[user] = stats.by_user.get(user, 0) + 1
    try:
        async with session.post(
            url + "/v1/chat/completions",
            data=json.dumps(body),
            headers={"Content-Type": "application/json", "X-LLMTOP-User": user},
        ) as resp:
            async for _ in resp.content.iter_any():
                pass
            ok = resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    if ok:
        stats.ok += 1
    else:
        # back off: an error status comes back at once (the proxy's 502 when the engine
        # is gone), and without a pause every worker would resend in a tight loop
        stats.failed += 1
        await asyncio.sleep(FAILURE_BACKOFF_S)


async def drive(
    url: str,
    plan: RampPlan | None = None,
    *,
    duration_s: float | None = None,
    seed: int = 1,
    stats: DriverStats | None = None,
) -> DriverStats:
    """Send traffic to ``url`` (an OpenAI-compatible base URL) following ``plan``."""
    plan = plan or RampPlan()
    stats = stats or DriverStats()
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker(i: int) -> None:
            # worker i is busy while the plan's concurrency is above i
            rng = random.Random(seed * 1000 + i)
            while True:
                if i >= plan.concurrency_at(time.monotonic() - start):
                    await asyncio.sleep(0.2)
                    continue
                await _one_request(session, url, rng, stats)

        workers = [asyncio.create_task(worker(i)) for i in range(plan.peak)]
        try:
            if duration_s is None:
                await asyncio.gather(*workers)
            else:
                await asyncio.sleep(duration_s)
        finally:
            for w in workers:
                w.cancel()
            for w in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
    return stats
