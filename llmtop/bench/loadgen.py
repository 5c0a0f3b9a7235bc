"""Load modes: closed-loop concurrency and open-loop (Poisson or constant) rate.

Closed loop: N workers each send the next request when their previous one ends — the
engine's pace sets the arrival rate. Open loop: arrivals are scheduled in advance and sent
at their time whether or not earlier requests have finished, and every latency is
measured from the **scheduled** send time, so a stalled server shows up in the latency of
every request scheduled during the stall (no coordinated omission). Closed loop by
duration counts the requests that finish inside the window (after the warm-up, by the
deadline); open loop counts the arrivals scheduled after the warm-up; with ``requests``
exactly that many requests started after the warm-up are measured.

Failures are not retried in a tight loop: a closed-loop worker whose requests keep failing
waits before its next one (:func:`backoff_s`), and a level in which nothing has succeeded
gives up early (:class:`FailureWatch`) instead of hammering a dead port for its whole
duration. Ctrl-C (cancellation) raises :class:`StepInterrupted`, which carries the level's
partial results.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Literal

import aiohttp

from llmtop.bench.client import BenchClient, _Cancelled, bench_session, error_kind
from llmtop.bench.workload import Workload
from llmtop.events import RequestRecord

Mode = Literal["concurrency", "rate"]
Progress = Callable[["StepRun"], None]

BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
GIVE_UP_FAILURES = 5
GIVE_UP_AFTER_S = 1.0


def backoff_s(consecutive_failures: int) -> float:
    """A closed-loop worker's wait before its next request: none after a success or a
    single failure (a level with occasional errors runs as fast as it can), then 50 ms,
    doubling to at most 1 s while its requests keep failing."""
    if consecutive_failures <= 1:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** (consecutive_failures - 2))


@dataclass
class FailureWatch:
    """Watches a level's requests (warm-up included) and decides when it gives up: none has
    succeeded, at least ``failures`` have failed (errors, timeouts), the first of them
    ``after_s`` ago."""

    failures: int = GIVE_UP_FAILURES
    after_s: float = GIVE_UP_AFTER_S
    any_ok: bool = False
    failed: int = 0
    answered: int = 0
    """Requests that got an HTTP answer (any status)."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Failures by kind (:func:`llmtop.bench.client.error_kind`)."""
    last_error: str | None = None
    """The latest failure's whole ``error`` text (``HTTP 404: model … not found``)."""
    _first: float | None = None

    def see(self, rec: RequestRecord) -> bool:
        """Count one finished request; True when the level should give up."""
        self.answered += rec.status > 0
        if rec.outcome == "ok":
            self.any_ok = True
            return False
        if rec.outcome not in ("error", "timeout"):
            return False
        self.failed += 1
        kind = error_kind(rec)
        self.last_error = rec.error
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        now = time.monotonic()
        if self._first is None:
            self._first = now
        return (not self.any_ok and self.failed >= self.failures
                and now - self._first >= self.after_s)


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
    gave_up: bool = False
    """The level ended early: nothing succeeded (see :class:`FailureWatch`)."""
    draining: int = 0
    """Open loop: requests still open when the last arrival had been sent (the level then
    waits for them, each until it ends or times out)."""
    cut_off: int = 0
    """Requests still open when the level ended (its deadline, or giving up), stopped and
    left out of ``records``."""
    cut_off_answered: int = 0
    """Of ``cut_off``, those that had an answer's head (an HTTP status) by then."""
    send_lags_ns: list[int] = field(default_factory=list)
    """Open loop: for each measured arrival, how late its request started against its
    scheduled time (the load generator's own delay: a busy client, a burst of arrivals).
    Every latency is measured from the schedule, so this lag is in each of them."""
    peak_open: int | None = None
    """Closed loop by ``requests``: the most requests open at once as a measured one
    started (itself included). Fewer requests than workers never hold the level's
    concurrency: ``--requests 2`` at concurrency 8 measures concurrency 2."""
    watch: FailureWatch = field(default_factory=FailureWatch)

    @property
    def duration_s(self) -> float:
        return max(self.ended - self.started, 1e-9)


class StepInterrupted(asyncio.CancelledError):
    """The level was cancelled (Ctrl-C); ``run`` holds what it had done, including the
    partial records of the requests it stopped."""

    def __init__(self, run: StepRun) -> None:
        super().__init__("benchmark interrupted")
        self.run = run


def _file(run: StepRun, rec: RequestRecord, measured: bool, watch: FailureWatch,
          progress: Progress | None) -> bool:
    """File one finished request in ``run`` (a warm-up one is only counted); True when
    ``watch`` says the level should give up."""
    gave_up = watch.see(rec)
    if gave_up:
        run.gave_up = True
    if measured:
        run.records.append(rec)
        if progress:
            progress(run)
    else:
        run.warmup_records += 1
    return gave_up


async def run_closed(
    client: BenchClient,
    workload: Workload,
    concurrency: int,
    *,
    duration_s: float | None = None,
    requests: int | None = None,
    warmup_s: float = 0.0,
    progress: Progress | None = None,
    watch: FailureWatch | None = None,
) -> StepRun:
    """``concurrency`` workers for ``duration_s`` (after ``warmup_s``) or until exactly
    ``requests`` measured requests have finished (the last of them run with fewer open, as
    workers find no request left to send).

    By duration, a request is measured when it *finishes* inside the window (after the
    warm-up, by the deadline), wherever it started: the window's completions over its
    length is the closed loop's throughput. Counting only requests that both start and
    finish inside it would leave out about one whole request per worker (the one still
    open at the deadline, and the warm-up one that ends inside the window), so tok/s and
    req/s came out low by about E2E ÷ duration, and a level whose requests take longer
    than the window finished none at all and read as failing its SLOs."""
    assert duration_s is not None or requests is not None
    watch = FailureWatch() if watch is None else watch
    mono0 = time.monotonic()
    measure_from = mono0 + warmup_s
    run = StepRun("concurrency", concurrency, started=time.time() + warmup_s, watch=watch,
                  peak_open=None if requests is None else 0)
    stop = asyncio.Event()
    open_now = 0
    claimed = 0
    working = concurrency

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal open_now, claimed, working
        failures = 0
        try:
            while not stop.is_set():
                begun = time.monotonic()
                measured = begun >= measure_from
                if measured and requests is not None:
                    if claimed >= requests:
                        return
                    claimed += 1
                req = workload.next()
                open_now += 1
                run.sent += 1
                if measured and run.peak_open is not None:
                    run.peak_open = max(run.peak_open, open_now)
                try:
                    rec = await client.send(session, req, concurrency=open_now)
                finally:
                    open_now -= 1
                if requests is None:  # by duration: what finished inside the window
                    measured = time.monotonic() >= measure_from and (
                        deadline is None or loop.time() <= deadline)
                if _file(run, rec, measured, watch, progress):
                    stop.set()
                failures = 0 if rec.outcome == "ok" else failures + 1
                pause = backoff_s(failures)
                if pause and not stop.is_set():
                    await asyncio.sleep(pause)
        finally:
            working -= 1
            if working == 0:  # every measured request is done
                stop.set()

    loop = asyncio.get_running_loop()
    deadline = None if duration_s is None else loop.time() + warmup_s + duration_s
    async with bench_session(concurrency) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
        stopper = asyncio.create_task(stop.wait())
        try:
            pending: set[asyncio.Task[None] | asyncio.Task[bool]] = {stopper, *tasks}
            while stopper in pending:
                left = None if deadline is None else max(deadline - loop.time(), 0.0)
                done, pending = await asyncio.wait(pending, timeout=left,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break  # time is up
                for t in done:  # a worker that died: its error is the benchmark's error
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
        except asyncio.CancelledError:
            run.interrupted = True
        finally:
            stop.set()
            run.ended = time.time()
            stopper.cancel()
            await _cancel_all(tasks, run)
    if run.interrupted:
        raise StepInterrupted(run)
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
    watch: FailureWatch | None = None,
) -> StepRun:
    """Arrivals at ``rate``/s (exponential gaps when ``poisson``, else constant), each
    measured from its scheduled time. By duration, the level lasts until its window's end
    or its last request's, whichever is later."""
    assert duration_s is not None or requests is not None
    watch = FailureWatch() if watch is None else watch
    rng = random.Random(seed)
    run = StepRun("rate", rate, started=time.time() + warmup_s, watch=watch)
    t0 = perf_counter_ns()
    warm_ns = int(warmup_s * 1e9)
    end_ns = None if duration_s is None else t0 + int((warmup_s + duration_s) * 1e9)
    in_flight: set[asyncio.Task[None]] = set()
    give_up = asyncio.Event()
    died: list[BaseException] = []

    def finished(task: asyncio.Task[None]) -> None:
        in_flight.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            died.append(exc)
            give_up.set()

    async def one(session: aiohttp.ClientSession, scheduled: int, measured: bool) -> None:
        if measured:
            run.send_lags_ns.append(perf_counter_ns() - scheduled)
        rec = await client.send(session, workload.next(), scheduled_ns=scheduled,
                                concurrency=len(in_flight))
        if _file(run, rec, measured, watch, progress):
            give_up.set()

    async with bench_session(min(max_outstanding, 4096)) as session:
        try:
            at = t0
            planned = 0
            k = 0  # arrivals scheduled so far
            while not give_up.is_set():
                # Poisson: the first arrival one exponential gap in (memoryless: a window
                # holds rate × duration of them on average); constant: at the start, then
                # every 1/rate (one gap in, a window held one fewer than rate × duration)
                at = at + int(rng.expovariate(rate) * 1e9) if poisson else \
                    t0 + int(k * 1e9 / rate)
                k += 1
                if end_ns is not None and at >= end_ns:
                    break
                measured = at - t0 >= warm_ns
                if requests is not None and measured and planned >= requests:
                    break
                delay = (at - perf_counter_ns()) / 1e9
                if delay > 0.05:  # a long gap: wake up at once if the level gives up
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(give_up.wait(), delay)
                        break
                elif delay > 0:
                    await asyncio.sleep(delay)
                if len(in_flight) >= max_outstanding:
                    run.overflow += 1
                    continue
                planned += int(measured)
                run.sent += 1
                task = asyncio.create_task(one(session, at, measured))
                in_flight.add(task)
                task.add_done_callback(finished)
            if in_flight and not give_up.is_set() and progress:
                run.draining = len(in_flight)
                progress(run)
            waiter = asyncio.create_task(give_up.wait())
            try:  # the requests still open, unless the level gave up
                while in_flight and not give_up.is_set():
                    await asyncio.wait([waiter, *in_flight],
                                       return_when=asyncio.FIRST_COMPLETED)
                # a level by duration lasts its window: its rates are over the window, not
                # over the span to its last arrival (Poisson: about 1/rate short of it,
                # so a low rate read high)
                rest = None if end_ns is None else (end_ns - perf_counter_ns()) / 1e9
                if rest is not None and rest > 0 and not give_up.is_set():
                    await asyncio.wait([waiter], timeout=rest)
            finally:
                waiter.cancel()
            if died:  # a request task that raised: its error is the benchmark's error
                raise died[0]
        except asyncio.CancelledError:
            run.interrupted = True
        finally:
            run.ended = time.time()
            await _cancel_all(list(in_flight), run)
    if run.interrupted:
        raise StepInterrupted(run)
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
            else:
                run.cut_off += 1
                run.cut_off_answered += c.record.status > 0
        except (asyncio.CancelledError, Exception):
            pass
