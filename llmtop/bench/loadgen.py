"""Load modes: closed-loop concurrency and open-loop (Poisson or constant) rate.

Closed loop: N workers each send the next request when their previous one ends — the
engine's pace sets the arrival rate. Open loop: arrivals are scheduled in advance and sent
at their time whether or not earlier requests have finished, and every latency is
measured from the **scheduled** send time, so a stalled server shows up in the latency of
every request scheduled during the stall (no coordinated omission). Requests started in
the warm-up are sent but not counted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Literal

import aiohttp

from llmtop.bench.client import BenchClient, _Cancelled
from llmtop.bench.workload import Workload
from llmtop.events import RequestRecord

Mode = Literal["concurrency", "rate"]
Progress = Callable[["StepRun"], None]


@dataclass
class StepRun:
    """One load level's raw results."""

    mode: Mode
    level: float
    started: float
    """Wall-clock start of the measured part (after warm-up)."""
    ended: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)
    warmup_records: int = 0
    sent: int = 0
    overflow: int = 0
    """Open loop: arrivals not sent because ``max_outstanding`` requests were open."""
    interrupted: bool = False

    @property
    def duration_s(self) -> float:
        return max(self.ended - self.started, 1e-9)


def _session(limit: int) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=max(limit, 1) + 8, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))


async def run_closed(
    client: BenchClient,
    workload: Workload,
    concurrency: int,
    *,
    duration_s: float | None = None,
    requests: int | None = None,
    warmup_s: float = 0.0,
    progress: Progress | None = None,
) -> StepRun:
    """``concurrency`` workers for ``duration_s`` (after ``warmup_s``) or until
    ``requests`` measured requests have finished."""
    assert duration_s is not None or requests is not None
    mono0 = time.monotonic()
    measure_from = mono0 + warmup_s
    run = StepRun("concurrency", concurrency, started=time.time() + warmup_s)
    stop = asyncio.Event()
    open_now = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal open_now
        while not stop.is_set():
            req = workload.next()
            begun = time.monotonic()
            open_now += 1
            run.sent += 1
            try:
                rec = await client.send(session, req, concurrency=open_now)
            finally:
                open_now -= 1
            if begun < measure_from:
                run.warmup_records += 1
                continue
            run.records.append(rec)
            if progress:
                progress(run)
            if requests is not None and len(run.records) >= requests:
                stop.set()

    async with _session(concurrency) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
        stopper = asyncio.create_task(stop.wait())
        try:
            limit = None if duration_s is None else warmup_s + duration_s
            done, _ = await asyncio.wait([stopper, *tasks], timeout=limit,
                                         return_when=asyncio.FIRST_COMPLETED)
            for t in done:  # a worker that died: its error is the benchmark's error
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        except asyncio.CancelledError:
            run.interrupted = True
            raise
        finally:
            stop.set()
            run.ended = time.time()
            stopper.cancel()
            await _cancel_all(tasks, run)
    return run


async def run_open(
    client: BenchClient,
    workload: Workload,
    rate: float,
    *,
    duration_s: float | None = None,
    requests: int | None = None,
    warmup_s: float = 0.0,
    poisson: bool = True,
    seed: int = 0,
    max_outstanding: int = 10_000,
    progress: Progress | None = None,
) -> StepRun:
    """Arrivals at ``rate``/s (exponential gaps when ``poisson``, else constant), each
    measured from its scheduled time."""
    assert duration_s is not None or requests is not None
    rng = random.Random(seed)
    run = StepRun("rate", rate, started=time.time() + warmup_s)
    t0 = perf_counter_ns()
    warm_ns = int(warmup_s * 1e9)
    end_ns = None if duration_s is None else t0 + int((warmup_s + duration_s) * 1e9)
    in_flight: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, scheduled: int, measured: bool) -> None:
        rec = await client.send(session, workload.next(), scheduled_ns=scheduled,
                                concurrency=len(in_flight))
        if measured:
            run.records.append(rec)
            if progress:
                progress(run)
        else:
            run.warmup_records += 1

    async with _session(min(max_outstanding, 4096)) as session:
        try:
            at = t0
            planned = 0
            while True:
                gap = rng.expovariate(rate) if poisson else 1.0 / rate
                at += int(gap * 1e9)
                if end_ns is not None and at >= end_ns:
                    break
                measured = at - t0 >= warm_ns
                if requests is not None and measured and planned >= requests:
                    break
                delay = (at - perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(in_flight) >= max_outstanding:
                    run.overflow += 1
                    continue
                planned += int(measured)
                run.sent += 1
                task = asyncio.create_task(one(session, at, measured))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.gather(*list(in_flight), return_exceptions=True)
        except asyncio.CancelledError:
            run.interrupted = True
            raise
        finally:
            run.ended = time.time()
            await _cancel_all(list(in_flight), run)
    return run


async def _cancel_all(tasks: list[asyncio.Task[None]], run: StepRun) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        try:
            await t
        except _Cancelled as c:
            if run.interrupted:  # Ctrl-C: keep what the stopped requests had so far
                run.records.append(c.record)
        except (asyncio.CancelledError, Exception):
            pass
