"""The rolling evidence the saturation detectors look at.

Fed from the bus (finished requests, engine and GPU readings) and from periodic samples of
the proxy's open requests. Everything is bounded: finished requests are kept for the long
window, baselines and samples for ``horizon_s``. Percentiles here are exact over a few
seconds of values (numpy) — they decide whether to warn, they are not reported figures
(those come from the HDR histograms in llmtop.metrics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from llmtop.config import SloConfig
from llmtop.events import ActiveRequest, EngineReading, Event, GpuReading, RequestRecord

UNREACHABLE_PREFIX = "upstream unreachable"
"""How the proxy's record of a failed upstream connect starts its ``error``."""


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
    chunk_t: np.ndarray
    """Unix time of every content chunk (float64)."""
    upstream_unreachable: bool

    @property
    def t_first(self) -> float | None:
        """When the first token reached the client (the end of its prefill, seen here)."""
        return None if self.ttft_s is None else self.t_start + self.ttft_s

    def gaps(self) -> np.ndarray:
        return np.diff(self.chunk_t)


@dataclass(frozen=True, slots=True)
class Sample:
    """One periodic reading of the proxy's open requests (and the engine's queue)."""

    t: float
    in_flight: int
    waiting: float
    """The engine's queue when a fresh engine reading exists, else the proxy's requests
    without a first token (queued or in prefill)."""
    streaming: int
    oldest_waiting_s: float


def _p(values: Iterable[float] | np.ndarray, q: float) -> float | None:
    arr = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def itl_p95(rec: RequestRecord) -> float | None:
    samples = rec.itl_samples_s()
    return _p(samples, 95) if samples else None


def is_unreachable(rec: RequestRecord) -> bool:
    """The proxy could not connect to the upstream for this request."""
    return rec.status == 502 and rec.ttft_s is None and (
        rec.error is None or rec.error.startswith(UNREACHABLE_PREFIX))


class Signals:
    """Rolling state: ``on_events`` is a bus subscriber, ``sample`` is called each tick.

    ``keep_s``: how long finished requests are kept (the detectors' longest window);
    ``horizon_s``: how long samples, engine readings and baselines are kept;
    ``engine_fresh_s``: an engine reading older than this is not used for the queue.
    """

    def __init__(self, keep_s: float = 60.0, horizon_s: float = 330.0,
                 engine_fresh_s: float = 5.0) -> None:
        self.keep_s = keep_s
        self.horizon_s = horizon_s
        self.engine_fresh_s = engine_fresh_s
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
                        chunk_t=ev.t_start + np.asarray(ev.chunk_offsets_s, dtype=float),
                        upstream_unreachable=is_unreachable(ev),
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
        if self.engine is not None and now - self.engine.t < self.engine_fresh_s:
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
        keep = now - self.keep_s
        while self.finished and self.finished[0].t_end < keep:
            self.finished.popleft()
        cut = now - self.horizon_s
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

    def gaps_in(self, now: float, window_s: float) -> np.ndarray:
        """Chunk gaps of the requests that finished in the window."""
        parts = [f.gaps() for f in self.finished_in(now, window_s) if f.chunk_t.size > 1]
        return np.concatenate(parts) if parts else np.empty(0)

    def itl_p50(self, now: float, window_s: float) -> float | None:
        return _p(self.gaps_in(now, window_s), 50)

    def output_tps(self, now: float, window_s: float) -> float:
        return sum(f.tokens for f in self.finished_in(now, window_s)) / window_s

    def remember_baselines(self, now: float, window_s: float, min_requests: int = 5) -> None:
        recent = [f for f in self.finished_in(now, window_s) if f.outcome == "ok"]
        if len(recent) >= min_requests:
            p = _p((f.ttft_s for f in recent if f.ttft_s is not None), 95)
            if p is not None:
                self.ttft_p95_history.append((now, p))
            q = self.itl_p50(now, window_s)
            if q is not None:
                self.itl_p50_history.append((now, q))

    def ttft_baseline(self) -> float | None:
        """What the service does unloaded: a low (10th) percentile of the window TTFT p95s
        seen in the horizon — low, but not the one luckiest window."""
        return _p((v for _, v in self.ttft_p95_history), 10)

    def itl_baseline(self) -> float | None:
        """A low (10th) percentile of the window chunk-gap p50s seen in the horizon."""
        return _p((v for _, v in self.itl_p50_history), 10)

    def slo_attainment(
        self, now: float, window_s: float, slo: SloConfig, which: str
    ) -> tuple[float | None, int]:
        """Share of the requests answered in the window (outcome ok) that met one SLO
        (``ttft``, ``itl``, ``e2e``). Failed requests are left to ERRORS/UPSTREAM_DOWN, so
        a latency warning is about latency."""
        limit = {"ttft": slo.ttft_s, "itl": slo.itl_p95_s, "e2e": slo.e2e_s}[which]
        if limit is None:
            return None, 0
        rows = [f for f in self.finished_in(now, window_s) if f.outcome == "ok"]
        if not rows:
            return None, 0
        ok = 0
        for f in rows:
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
