"""The rolling evidence the saturation detectors look at.

Fed from the bus (finished requests, engine and GPU readings) and from periodic samples of
the proxy's open requests. Everything is bounded: deques trimmed to the longest window.
Percentiles here are exact over a few seconds of values (numpy) — they decide whether to
warn, they are not reported figures (those come from the HDR histograms in llmtop.metrics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from llmtop.config import SloConfig
from llmtop.events import ActiveRequest, EngineReading, Event, GpuReading, RequestRecord


@dataclass(frozen=True, slots=True)
class Finished:
    """What the detectors keep of one finished request."""

    t_end: float
    t_start: float
    outcome: str
    status: int
    ttft_s: float | None
    e2e_s: float
    itl_p95_s: float | None
    tokens: int
    prompt_tokens: int | None
    gaps: tuple[float, ...]
    upstream_unreachable: bool


@dataclass(frozen=True, slots=True)
class Sample:
    """One periodic reading of the proxy's open requests (and the engine's queue)."""

    t: float
    in_flight: int
    waiting: float
    streaming: int
    oldest_waiting_s: float


def _p(values: Iterable[float], q: float) -> float | None:
    arr = np.fromiter(values, dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def itl_p95(rec: RequestRecord) -> float | None:
    samples = rec.itl_samples_s()
    return _p(samples, 95) if samples else None


class Signals:
    """Rolling state: ``on_events`` is a bus subscriber, ``sample`` is called each tick."""

    def __init__(self, horizon_s: float = 330.0) -> None:
        self.horizon_s = horizon_s
        self.finished: deque[Finished] = deque()
        self.samples: deque[Sample] = deque()
        self.engine: EngineReading | None = None
        self.engine_history: deque[EngineReading] = deque()
        self.gpus: dict[int, GpuReading] = {}
        self.ttft_p95_history: deque[tuple[float, float]] = deque()
        self.itl_p50_history: deque[tuple[float, float]] = deque()

    # -- input ---------------------------------------------------------------------------

    def on_events(self, batch: Iterable[Event]) -> None:
        for ev in batch:
            if isinstance(ev, RequestRecord):
                self.finished.append(
                    Finished(
                        t_end=ev.t_start + ev.e2e_s,
                        t_start=ev.t_start,
                        outcome=ev.outcome,
                        status=ev.status,
                        ttft_s=ev.ttft_s,
                        e2e_s=ev.e2e_s,
                        itl_p95_s=itl_p95(ev),
                        tokens=ev.completion_tokens or 0,
                        prompt_tokens=ev.prompt_tokens,
                        gaps=tuple(ev.chunk_gaps_s()),
                        upstream_unreachable=ev.status == 502 and ev.ttft_s is None,
                    )
                )
            elif isinstance(ev, EngineReading):
                self.engine = ev
                self.engine_history.append(ev)
            elif isinstance(ev, GpuReading):
                self.gpus[ev.index] = ev

    def sample(self, now: float, active: Mapping[str, ActiveRequest], now_ns: int) -> Sample:
        waiting = [a for a in active.values() if a.first_token_ns is None]
        oldest = max(((now_ns - a.t0_ns) / 1e9 for a in waiting), default=0.0)
        engine_waiting = None
        if self.engine is not None and now - self.engine.t < 5.0:
            engine_waiting = self.engine.waiting
        s = Sample(
            t=now,
            in_flight=len(active),
            waiting=float(engine_waiting if engine_waiting is not None else len(waiting)),
            streaming=len(active) - len(waiting),
            oldest_waiting_s=oldest,
        )
        self.samples.append(s)
        self._trim(now)
        return s

    def _trim(self, now: float) -> None:
        cut = now - self.horizon_s
        for dq in (self.finished,):
            while dq and dq[0].t_end < cut:
                dq.popleft()
        while self.samples and self.samples[0].t < cut:
            self.samples.popleft()
        while self.engine_history and self.engine_history[0].t < cut:
            self.engine_history.popleft()
        for hist in (self.ttft_p95_history, self.itl_p50_history):
            while hist and hist[0][0] < cut:
                hist.popleft()

    # -- views over a window -------------------------------------------------------------

    def finished_in(self, now: float, window_s: float) -> list[Finished]:
        cut = now - window_s
        return [f for f in self.finished if f.t_end >= cut]

    def samples_in(self, now: float, window_s: float) -> list[Sample]:
        cut = now - window_s
        return [s for s in self.samples if s.t >= cut]

    def ttft_p95(self, now: float, window_s: float) -> float | None:
        return _p((f.ttft_s for f in self.finished_in(now, window_s) if f.ttft_s is not None), 95)

    def itl_p50(self, now: float, window_s: float) -> float | None:
        gaps: list[float] = []
        for f in self.finished_in(now, window_s):
            gaps.extend(f.gaps)
        return _p(gaps, 50)

    def gap_percentiles(self, now: float, window_s: float) -> tuple[float | None, float | None]:
        gaps: list[float] = []
        for f in self.finished_in(now, window_s):
            gaps.extend(f.gaps)
        if len(gaps) < 20:
            return None, None
        return _p(gaps, 50), _p(gaps, 99)

    def output_tps(self, now: float, window_s: float) -> float:
        return sum(f.tokens for f in self.finished_in(now, window_s)) / window_s

    def remember_baselines(self, now: float, window_s: float, min_requests: int = 5) -> None:
        recent = self.finished_in(now, window_s)
        if len(recent) >= min_requests:
            p = self.ttft_p95(now, window_s)
            if p is not None:
                self.ttft_p95_history.append((now, p))
            q = self.itl_p50(now, window_s)
            if q is not None:
                self.itl_p50_history.append((now, q))

    def ttft_baseline(self) -> float | None:
        """The lowest 10-s TTFT p95 seen in the horizon: what the service does unloaded."""
        return min((v for _, v in self.ttft_p95_history), default=None)

    def itl_baseline(self) -> float | None:
        return min((v for _, v in self.itl_p50_history), default=None)

    def slo_attainment(
        self, now: float, window_s: float, slo: SloConfig, which: str
    ) -> tuple[float | None, int]:
        """Share of requests in the window that met one SLO (``ttft``, ``itl``, ``e2e``);
        a request that did not end ok misses every SLO."""
        limit = {"ttft": slo.ttft_s, "itl": slo.itl_p95_s, "e2e": slo.e2e_s}[which]
        if limit is None:
            return None, 0
        rows = [f for f in self.finished_in(now, window_s) if f.outcome != "cancelled"]
        if not rows:
            return None, 0
        ok = 0
        for f in rows:
            if f.outcome != "ok":
                continue
            value = {"ttft": f.ttft_s, "itl": f.itl_p95_s, "e2e": f.e2e_s}[which]
            if value is None and which == "itl":
                ok += 1  # a one-token answer has no ITL to miss
            elif value is not None and value <= limit:
                ok += 1
        return ok / len(rows), len(rows)

    def preemptions_delta(self, now: float, window_s: float) -> float:
        cut = now - window_s
        hist = [e for e in self.engine_history if e.t >= cut and e.preemptions is not None]
        if len(hist) < 2:
            return 0.0
        return max(0.0, float(hist[-1].preemptions or 0) - float(hist[0].preemptions or 0))
