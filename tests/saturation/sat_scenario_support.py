"""Scenario harness for the saturation detectors: ``llmtop sim`` behind llmtop's proxy,
observed by the real pipeline (EventBus, Aggregator, SaturationMonitor, the simulated-GPU
source and the engine scraper), with open- and closed-loop load generators and a timeline
of the warnings.

Time is compressed consistently: the simulator runs at ``SCALE`` × real time, and every
detector duration (window, raise and clear hysteresis, tick, sampling intervals) is
multiplied by ``SCALE`` too, so "QUEUEING within 10 s" becomes "within 10 × SCALE s".
The latency SLOs are not compressed: they are a user's targets, and here they must sit
above what this test machine adds to every measurement — the simulator, the proxy and the
clients share one event loop on two cores shared with other test suites, so chunk gaps of
50–150 ms happen at light load, and SLO_ITL at the default 50 ms would (rightly) report
them. The TTFT SLO keeps its default (0.5 s); the ITL p95 SLO is 0.2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmtop.bus import EventBus
from llmtop.config import Config, load_config
from llmtop.engines.scraper import EngineScraper
from llmtop.events import ActiveRequest, Event, RequestRecord, WarningEvent
from llmtop.gpu.simsource import SimGpuSource
from llmtop.metrics.aggregator import Aggregator
from llmtop.proxy.server import ProxyServer
from llmtop.saturation import SaturationMonitor
from llmtop.sim.server import SimHandle, running_sim

SCALE = 0.4
"""Simulated time runs this many times real time; detector durations shrink to match."""


def scenario_config(upstream: str, **overrides: Any) -> Config:
    """Defaults with every detector duration compressed by ``SCALE``."""
    base: dict[str, Any] = {
        "upstream": upstream,
        "listen": "127.0.0.1:0",
        "warnings.window_s": round(10 * SCALE),
        "warnings.clear_after_s": 15 * SCALE,
        "warnings.raise_after_s": 2 * SCALE,
        "engine.interval_s": 1.0 * SCALE,
        "slo.itl_p95_s": 0.2,
        "timeouts.connect_s": 2.0,
    }
    base.update(overrides)
    return load_config(None, env={}, overrides=base)


class SimSlot:
    """A simulator that can be stopped and started again on the same port."""

    def __init__(self, **overrides: Any) -> None:
        self.overrides = overrides
        self.port = 0
        self.handle: SimHandle | None = None
        self._cm: contextlib.AbstractAsyncContextManager[SimHandle] | None = None

    @property
    def url(self) -> str:
        assert self.handle is not None
        return self.handle.url

    async def start(self, **overrides: Any) -> SimHandle:
        """Start (again), with this slot's overrides updated by ``overrides``."""
        self.overrides.update(overrides)
        kw = {"seed": 7, "time_scale": SCALE, **self.overrides}
        self._cm = running_sim("tiny", port=self.port, **kw)
        self.handle = await self._cm.__aenter__()
        self.port = self.handle.port
        return self.handle

    async def stop(self) -> None:
        if self._cm is not None:
            cm, self._cm = self._cm, None
            await cm.__aexit__(None, None, None)


@dataclass
class Pipeline:
    """A running proxy + observers in front of ``slot``. Timeline times are
    ``time.monotonic()`` values."""

    cfg: Config
    slot: SimSlot
    proxy: ProxyServer
    url: str
    bus: EventBus
    active: dict[str, ActiveRequest]
    aggregator: Aggregator
    monitor: SaturationMonitor
    t0: float = field(default_factory=time.monotonic)
    timeline: list[tuple[float, WarningEvent]] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)

    def on_events(self, batch: list[Event] | tuple[Event, ...]) -> None:
        now = time.monotonic()
        for e in batch:
            if isinstance(e, WarningEvent):
                self.timeline.append((now, e))
            elif isinstance(e, RequestRecord):
                self.records.append(e)

    def raised_codes(self, after: float = 0.0) -> set[str]:
        """Every code raised at or after ``after``."""
        return {e.code for t, e in self.timeline if e.state == "raised" and t >= after}

    def first(self, code: str, state: str = "raised", after: float = 0.0) -> float | None:
        """Monotonic time of the first ``state`` transition of ``code`` at/after ``after``."""
        for t, e in self.timeline:
            if e.code == code and e.state == state and t >= after:
                return t
        return None

    def message(self, code: str) -> str:
        for _, e in self.timeline:
            if e.code == code and e.state == "raised":
                return e.message
        raise AssertionError(f"{code} never raised")

    async def wait_for(self, code: str, state: str = "raised", *, after: float = 0.0,
                       within: float = 30.0) -> float | None:
        """Wait up to ``within`` s until ``code`` makes the ``state`` transition at/after
        ``after``; returns its monotonic time, or None."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            t = self.first(code, state, after)
            if t is not None:
                return t
            await asyncio.sleep(0.05)
        return self.first(code, state, after)

    def describe(self) -> str:
        """The timeline, one warning a line, and the evidence now (for assertion messages)."""
        lines = [f"  {t - self.t0:6.2f}s {e.state} {e.code}: {e.message}"
                 for t, e in self.timeline] or ["  no warnings"]
        return "\n".join([*lines, "  now: " + self.evidence()])

    def evidence(self) -> str:
        """What the detectors see at this moment (to tell a detector fault from a machine
        that is too loaded to run the simulator at its pace)."""
        sig = self.monitor.signals
        now = time.time()
        w = float(self.cfg.warnings.window_s)
        samples = sig.samples_in(now, w)
        gpu = sig.gpus.get(0)
        eng = sig.engine

        def ms(x: float | None) -> str:
            return "n/a" if x is None else f"{x * 1000:.0f} ms"

        return (
            f"{len(sig.finished_in(now, w))} requests in {w:g} s, TTFT p95 "
            f"{ms(sig.ttft_p95(now, w))} (baseline {ms(sig.ttft_baseline())}), ITL p50 "
            f"{ms(sig.itl_p50(now, w))} (baseline {ms(sig.itl_baseline())}), queue non-empty "
            f"in {sum(s.waiting >= 1 for s in samples)}/{len(samples)} samples; GPU "
            f"{'n/a' if gpu is None else f'bw {gpu.dram_bw_util}% busy {gpu.util_gpu}%'}; "
            f"engine {'n/a' if eng is None else f'{eng.running} running {eng.waiting} waiting'}"
            f"; simulator steps {self.slot.handle.engine.steps if self.slot.handle else 'n/a'}"
        )


@contextlib.asynccontextmanager
async def pipeline(slot: SimSlot, *, engine_metrics: bool = True, **overrides: Any
                   ) -> AsyncIterator[Pipeline]:
    """The proxy in front of ``slot`` with the observers ``llmtop run`` has, at the
    compressed rate: aggregator twice a tick, detectors once a tick (tick = SCALE s).
    ``engine_metrics=False``: no engine scraper (as with an engine that has no /metrics)."""
    cfg = scenario_config(slot.url, **overrides)
    bus = EventBus()
    active: dict[str, ActiveRequest] = {}
    proxy = ProxyServer(cfg, bus, active)
    url = await proxy.start()
    agg = Aggregator(cfg, active, upstream=slot.url)
    mon = SaturationMonitor(cfg, bus.publish, active, upstream_down=lambda: proxy.upstream_down)
    p = Pipeline(cfg, slot, proxy, url, bus, active, agg, mon)
    bus.subscribe(agg.on_events)
    bus.subscribe(mon.on_events)
    bus.subscribe(p.on_events)
    gpu = SimGpuSource(slot.url + "/sim/gpu", None, bus.publish, interval_s=0.5 * SCALE,
                       max_backoff_s=0.5)
    scraper = EngineScraper(slot.url + "/metrics", None, bus.publish,
                            interval_s=cfg.engine.interval_s, max_backoff_s=0.5)

    async def ticker() -> None:
        n = 0
        while True:
            await asyncio.sleep(SCALE / 2)
            agg.tick()
            n += 1
            if n % 2 == 0:
                bus.drain()
                mon.tick()

    tasks = [asyncio.create_task(bus.pump(0.02)), asyncio.create_task(ticker()),
             asyncio.create_task(gpu.run())]
    if engine_metrics:
        tasks.append(asyncio.create_task(scraper.run()))
    try:
        yield p
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await proxy.shutdown(0.5)
        bus.drain()


@contextlib.asynccontextmanager
async def scenario(sim: dict[str, Any] | None = None, cfg: dict[str, Any] | None = None,
                   *, engine_metrics: bool = True) -> AsyncIterator[Pipeline]:
    """A tiny simulator (``sim``: profile overrides) and the pipeline in front of it
    (``cfg``: config overrides by dotted key; ``engine_metrics=False``: its /metrics are
    not scraped)."""
    slot = SimSlot(**(sim or {}))
    await slot.start()
    try:
        async with pipeline(slot, engine_metrics=engine_metrics, **(cfg or {})) as p:
            yield p
    finally:
        await slot.stop()


# -- load ----------------------------------------------------------------------------------
# Plain aiohttp streaming clients: the openai SDK costs ~45 ms of CPU per 32-token stream
# (a pydantic object per chunk) — three times what the proxy and the simulator together
# spend on it — and on two cores shared with other suites that starves the simulator's
# pacing, which is exactly what these scenarios must not do by accident. (The proxy's
# compatibility with the SDK is tested in tests/proxy.)


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60.0),
                                 connector=aiohttp.TCPConnector(limit=0))


async def one_chat(session: aiohttp.ClientSession, url: str, stats: LoadStats, *,
                   max_tokens: int, prompt_tokens: int = 17, fault: str | None = None) -> bool:
    """One streamed chat completion; True when it ended with ``data: [DONE]``. Failures are
    counted, never raised. ``prompt_tokens`` as the simulator counts a one-message chat."""
    stats.sent += 1
    chars = 4 * max(1, prompt_tokens - 7)  # 4 + ceil(chars / 4) + 3 tokens
    body = json.dumps({"model": "sim-tiny", "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "x" * chars}]})
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["X-Sim-Fault"] = fault
    tail = b""
    try:
        async with session.post(url + "/v1/chat/completions", data=body,
                                headers=headers) as resp:
            async for data in resp.content.iter_any():
                tail = (tail + data)[-64:]
            status = resp.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        stats.failed += 1
        return False
    if status != 200 or b"[DONE]" not in tail:
        stats.failed += 1
        stats.statuses[status] = stats.statuses.get(status, 0) + 1
        return False
    stats.ok += 1
    return True


class OpenLoop:
    """Poisson arrivals at ``rate`` requests/s (may be changed while running); every
    ``fault_every``-th request carries ``X-Sim-Fault: fault`` while ``fault`` is set."""

    def __init__(self, url: str, rate: float, *, max_tokens: int = 32, prompt_tokens: int = 17,
                 seed: int = 1, fault: str | None = None, fault_every: int = 0) -> None:
        self.url = url
        self.session = _session()
        self.rate = rate
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.rng = random.Random(seed)
        self.fault = fault
        self.fault_every = fault_every
        self.stats = LoadStats()
        self._tasks: set[asyncio.Task[bool]] = set()
        self._runner = asyncio.create_task(self._run())

    async def _run(self) -> None:
        n = 0
        next_t = time.monotonic()
        while True:
            if self.rate <= 0:
                await asyncio.sleep(0.05)
                next_t = time.monotonic()
                continue
            next_t += self.rng.expovariate(self.rate)
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            n += 1
            fault = self.fault if self.fault and self.fault_every and \
                n % self.fault_every == 0 else None
            t = asyncio.create_task(one_chat(self.session, self.url, self.stats,
                                             max_tokens=self.max_tokens,
                                             prompt_tokens=self.prompt_tokens, fault=fault))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop sending; requests in flight may finish for ``drain_s``, then are cancelled."""
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._runner
        await _finish(set(self._tasks), drain_s)
        await self.session.close()


class ClosedLoop:
    """``n`` workers, each sending its next request when its last one ended (after a short
    pause when it failed, so a dead upstream is not hammered)."""

    def __init__(self, url: str, n: int, *, max_tokens: int = 32, prompt_tokens: int = 17
                 ) -> None:
        self.url = url
        self.session = _session()
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.stats = LoadStats()
        self._workers: list[asyncio.Task[None]] = []
        self._n = 0
        self.resize(n)

    def resize(self, n: int) -> None:
        """Grow at once; shrink by letting the extra workers finish their request."""
        self._n = n
        for i in range(n):
            if i == len(self._workers):
                self._workers.append(asyncio.create_task(self._worker(i)))
            elif self._workers[i].done():
                self._workers[i] = asyncio.create_task(self._worker(i))

    async def _worker(self, i: int) -> None:
        while i < self._n:
            if not await one_chat(self.session, self.url, self.stats,
                                  max_tokens=self.max_tokens,
                                  prompt_tokens=self.prompt_tokens):
                await asyncio.sleep(0.1)

    async def stop(self, drain_s: float = 5.0) -> None:
        self._n = 0
        await _finish(set(self._workers), drain_s)
        self._workers.clear()
        await self.session.close()


async def _finish(tasks: set[asyncio.Task[Any]], drain_s: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for t in pending:
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def measure_capacity(url: str, seconds: float, *, max_tokens: int = 32) -> float:
    """Requests/s that four closed-loop clients (the tiny profile's max_num_seqs: the
    knee) get, after a second of warm-up (connections, the SDK's first-request costs)."""
    load = ClosedLoop(url, 4, max_tokens=max_tokens)
    await asyncio.sleep(1.0)
    before = load.stats.ok
    await asyncio.sleep(seconds)
    done = load.stats.ok - before
    await load.stop()
    return done / seconds
