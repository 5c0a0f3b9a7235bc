"""A recording → the report: conditions first, then the figures (a JSON-ready dict).

Every latency figure, rate, SLO attainment, goodput, per-user TPS and the capacity estimate
comes from :class:`llmtop.metrics.aggregator.Aggregator` fed by
:class:`~llmtop.recording.replay.ReplayEngine` — the code that produced the live numbers.
Latency by concurrency goes through :func:`llmtop.metrics.ingest.ingest` and
:func:`llmtop.metrics.table.group_stats` with the concurrency level as the series. Token
length and concurrency distributions use :class:`llmtop.metrics.hdr.Histogram` (integers
below 2048 are exact). What is counted here directly is only counting: outcomes, models,
arrivals per second, reading peaks — and requests in flight (and waiting for a first
token), which are exact from the records' start and end times
(:mod:`llmtop.recording.report.inflight`) rather than the aggregator's once-a-tick samples:
the session's mean and max in ``conditions.in_flight`` and each ``series`` point's
``in_flight_mean``/``in_flight_max``/``waiting_mean`` over that point's window.

The dict (``REPORT_VERSION`` 1) has these sections: ``report_version``, ``source``
(file, header, completeness), ``conditions``, ``latency``, ``throughput``, ``outcomes``,
``slo``, ``capacity``, ``users``, ``models``, ``by_concurrency``, ``warnings``, ``gpus``,
``engine``, ``series`` (time series for plots), ``gpu_series``, ``distributions``,
``slowest`` (:mod:`llmtop.recording.report.slowest`: ``{"k": K, "ttft": [...], "e2e":
[...]}``, the K requests with the longest TTFT and the K with the longest E2E, slowest
first, each ``{"id", "upstream_id", "t_start", "user", "model", "outcome", "status",
"stream", "ttft_s", "e2e_s", "output_tokens"}``; ``upstream_id`` ``None`` when the engine
named none). Latencies are seconds, ``None`` where there is no data.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from llmtop.events import (
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    WarningEvent,
    counter_rise,
)
from llmtop.metrics.hdr import HIGHEST_EQ, Histogram, decode_sparse
from llmtop.metrics.ingest import (
    C_GOOD,
    C_JUDGED,
    C_MET,
    C_OUT_DONE,
    C_REQ,
    COUNTERS,
    METRICS,
    ingest,
)
from llmtop.metrics.labels import model_label
from llmtop.metrics.slo import Slo
from llmtop.metrics.table import CountTable, group_stats
from llmtop.recording.parts import Series, Source, resolve, source_path
from llmtop.recording.reader import Progress, read_header, recorder_counts
from llmtop.recording.replay import DEFAULT_LOOKAHEAD_S, ReplayEngine, config_for
from llmtop.recording.report.fmt import PERCENTILE_NOTE
from llmtop.recording.report.inflight import in_flight
from llmtop.recording.report.slowest import SLOWEST, Slowest

REPORT_VERSION: Final = 1
PCTS: Final = (50.0, 90.0, 95.0, 99.0)
MAX_SERIES_POINTS: Final = 600
_STEPS: Final = ((2, 10), (10, 10), (60, 60), (300, 300))
"""(snapshot every s, over a window of s): a sliding 10 s window every 2 s for short
recordings, coarser as they grow (windows the aggregator offers: 10, 60, 300)."""
_BATCH: Final = 5000
_BATCH_CHUNKS: Final = 200_000
_SEVERITY_RANK: Final = {"info": 0, "warning": 1, "critical": 2}
"""A batch is also filed once its records hold this many chunks: filing is vectorised at
~350 B per chunk for the moment (QA soak: 3,000 answers of 2,000 chunks peaked at 2.3 GB
with a batch bounded only by records)."""
_MAX_CONC_SERIES: Final = 60_000  # concurrency levels above share the last series
_CONC_BASE: Final = 2  # series 0: system, 1: a dummy "model" series


class _IntDist:
    """Whole numbers (token counts, concurrency): percentiles from a histogram (3
    significant digits), count, min, mean and max exact — 64 answers of exactly 16,385
    tokens read "min 16,384, max 16,399, mean 16,392" from the histogram alone."""

    __slots__ = ("hist", "max", "min", "n", "total")

    def __init__(self) -> None:
        self.hist = Histogram()
        self.n = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None

    def record(self, values: list[int] | npt.NDArray[np.int64]) -> None:
        if len(values) == 0:
            return
        arr = np.asarray(values, dtype=np.int64)
        self.hist.record_us(arr)
        self.n += len(arr)
        self.total += int(arr.sum())
        lo, hi = int(arr.min()), int(arr.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)

    def summary(self) -> dict[str, Any]:
        """count/min/mean/p50/p90/p99/max (None when empty); percentiles clamped to the
        exact min and max."""
        if self.n == 0 or self.min is None or self.max is None:
            return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None,
                    "p99": None, "max": None}
        lo, hi = self.min, self.max
        p50, p90, p99 = (min(max(p, lo), hi) for p in self.hist.percentiles([50, 90, 99]))
        return {"count": self.n, "min": lo, "mean": self.total / self.n, "p50": p50,
                "p90": p90, "p99": p99, "max": hi}


class _Collector:
    """What the aggregator does not keep, gathered in one pass as events are read."""

    def __init__(self, slo: Slo, slowest: int = SLOWEST) -> None:
        self.slo = slo
        self.slowest = Slowest(slowest)
        self.models: Counter[str] = Counter()
        self.models_ok: Counter[str] = Counter()
        """Models of the requests that succeeded: a failed request records the name it was
        asked for (an alias, a typo), a successful one the engine's own."""
        self.dialects: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.error_messages: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.token_sources: Counter[str] = Counter()
        self.streaming = 0
        self.requests = 0
        self.prompt = _IntDist()
        self.completion = _IntDist()
        self.conc = _IntDist()
        self.starts = array("d")
        """Every request's t_start (8 bytes a request): arrival rates over the span."""
        self.ends = array("d")
        """... its end (t_start + e2e_s): requests in flight, exactly."""
        self.firsts = array("d")
        """... its first token (its end without one): requests waiting, exactly."""
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._pending: list[RequestRecord] = []
        self._pending_chunks = 0
        # latency and counts by concurrency at start (metrics code, concurrency as series)
        self.conc_table = CountTable.empty()
        self.conc_counters = np.zeros((64, len(COUNTERS)), dtype=np.int64)
        self.conc_e2e = np.zeros(64)
        self.gpus: dict[int, dict[str, Any]] = {}
        self.gpu_buckets: dict[int, dict[int, list[float | None]]] = {}
        self.engine: dict[str, Any] = {"kind": None, "readings": 0, "running_max": None,
                                       "waiting_max": None, "kv_cache_usage_max": None,
                                       "preemptions_first": None, "preemptions_last": None,
                                       "preemptions": None}
        self.engine_buckets: dict[int, list[float | None]] = {}
        self.warnings: list[dict[str, Any]] = []
        self._open_warnings: dict[str, dict[str, Any]] = {}

    # -- events ------------------------------------------------------------------------

    def __call__(self, e: Event) -> None:
        t = e.t_start + e.e2e_s if isinstance(e, RequestRecord) else e.t
        if self.first_t is None or t < self.first_t:
            self.first_t = t
        if self.last_t is None or t > self.last_t:
            self.last_t = t
        if isinstance(e, RequestRecord):
            self._request(e)
        elif isinstance(e, GpuReading):
            self._gpu(e)
        elif isinstance(e, EngineReading):
            self._engine(e)
        elif isinstance(e, WarningEvent):
            self._warning(e)

    def _request(self, r: RequestRecord) -> None:
        self.requests += 1
        model = model_label(r.model)  # (as the live rows name it: "unknown" for none)
        self.models[model] += 1
        if r.outcome == "ok":
            self.models_ok[model] += 1
        self.dialects[r.dialect] += 1
        self.paths[r.path] += 1
        self.outcomes[r.outcome] += 1
        self.statuses[r.status] += 1
        self.token_sources[r.token_source] += 1
        if r.error and r.outcome in ("error", "timeout"):  # a cancel is no error
            self.error_messages[r.error[:120]] += 1
        if r.stream:
            self.streaming += 1
        self.starts.append(r.t_start)
        if self.first_start is None or r.t_start < self.first_start:
            self.first_start = r.t_start
        end = r.t_start + r.e2e_s
        self.ends.append(end)
        self.firsts.append(end if r.ttft_s is None else r.t_start + min(r.ttft_s, r.e2e_s))
        if self.last_end is None or end > self.last_end:
            self.last_end = end
        self.slowest.add(r)
        self._pending.append(r)
        self._pending_chunks += len(r.chunk_offsets_s)
        if len(self._pending) >= _BATCH or self._pending_chunks >= _BATCH_CHUNKS:
            self.flush()

    def flush(self) -> None:
        recs, self._pending = self._pending, []
        self._pending_chunks = 0
        if not recs:
            return
        self.prompt.record([r.prompt_tokens for r in recs if r.prompt_tokens is not None])
        self.completion.record(
            [r.completion_tokens for r in recs if r.completion_tokens is not None]
        )
        conc = np.array([max(0, r.concurrency_at_start) for r in recs], dtype=np.int64)
        self.conc.record(conc)
        series = np.minimum(conc, _MAX_CONC_SERIES) + _CONC_BASE
        top = int(series.max()) + 1
        if top > len(self.conc_counters):
            size = max(top, 2 * len(self.conc_counters))
            grown = np.zeros((size, len(COUNTERS)), dtype=np.int64)
            grown[: len(self.conc_counters)] = self.conc_counters
            self.conc_counters = grown
            e2e = np.zeros(size)
            e2e[: len(self.conc_e2e)] = self.conc_e2e
            self.conc_e2e = e2e
        shape = (len(self.conc_counters), len(COUNTERS))
        b = ingest(recs, series.tolist(), [1] * len(recs), [0] * len(recs), self.slo, shape)
        self.conc_table = CountTable.merge([self.conc_table, b.table])
        self.conc_counters += b.counters
        np.add.at(self.conc_e2e, series, b.e2e_s)

    def _gpu(self, g: GpuReading) -> None:
        d = self.gpus.get(g.index)
        if d is None:
            d = self.gpus[g.index] = {
                "index": g.index, "name": g.name, "simulated": g.simulated, "readings": 0,
                "mem_total_bytes": g.mem_total_bytes, "mem_used_peak_bytes": None,
                "mem_used_peak_at": None, "dram_bw_util_peak": None,
                "dram_bw_util_peak_at": None, "mem_busy_peak": None, "util_gpu_peak": None,
                "power_w_peak": None,
            }
        d["readings"] += 1
        if g.mem_total_bytes:
            d["mem_total_bytes"] = g.mem_total_bytes
        for key, peak, at in (("mem_used_bytes", "mem_used_peak_bytes", "mem_used_peak_at"),
                              ("dram_bw_util", "dram_bw_util_peak", "dram_bw_util_peak_at"),
                              ("mem_busy", "mem_busy_peak", None),
                              ("util_gpu", "util_gpu_peak", None),
                              ("power_w", "power_w_peak", None)):
            v = getattr(g, key)
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                continue
            if d[peak] is None or v > d[peak]:
                d[peak] = v
                if at:
                    d[at] = g.t
        b = self.gpu_buckets.setdefault(g.index, {})
        row = b.setdefault(math.floor(g.t), [None, None, None])
        for i, v in enumerate((g.mem_used_bytes, g.dram_bw_util, g.mem_busy)):
            if v is not None and math.isfinite(v):
                cur = row[i]
                row[i] = v if cur is None else max(cur, v)

    def _engine(self, e: EngineReading) -> None:
        d = self.engine
        d["kind"] = e.kind
        d["readings"] += 1
        for key, peak in (("running", "running_max"), ("waiting", "waiting_max"),
                          ("kv_cache_usage", "kv_cache_usage_max")):
            v = getattr(e, key)
            if v is not None and math.isfinite(v) and (d[peak] is None or v > d[peak]):
                d[peak] = v
        if e.preemptions is not None and math.isfinite(e.preemptions):
            last = d["preemptions_last"]
            if d["preemptions_first"] is None:
                d["preemptions_first"] = e.preemptions
                d["preemptions"] = 0.0
            else:  # the counter's rises: an engine restart resets it (last − first < 0)
                d["preemptions"] += counter_rise(last, e.preemptions)
            d["preemptions_last"] = e.preemptions
        row = self.engine_buckets.setdefault(math.floor(e.t), [None, None, None])
        for i, v in enumerate((e.running, e.waiting, e.kv_cache_usage)):
            if v is not None and math.isfinite(v):
                cur = row[i]
                row[i] = v if cur is None else max(cur, v)

    def _warning(self, w: WarningEvent) -> None:
        if w.state == "raised":
            open_ep = self._open_warnings.get(w.code)
            if open_ep is not None:  # still raised: a second line means a new severity
                if _SEVERITY_RANK.get(w.severity, 0) > _SEVERITY_RANK.get(
                        open_ep["severity"], 0):
                    open_ep["severity"] = w.severity
                    open_ep["message"] = w.message
                    open_ep["escalated_at"] = w.t
                return
            # carried into a rotated part still raised: ``since`` is its first raise,
            # before this file's start (its own line is at the part's start)
            ep = {"code": w.code, "severity": w.severity, "message": w.message,
                  "raised_at": w.t, "cleared_at": None, "duration_s": None,
                  "since": w.since}
            self._open_warnings[w.code] = ep
            self.warnings.append(ep)
        else:
            ep2 = self._open_warnings.pop(w.code, None)
            if ep2 is not None:
                ep2["cleared_at"] = w.t
                since = ep2.get("since")
                first = ep2["raised_at"] if since is None else min(since, ep2["raised_at"])
                ep2["duration_s"] = w.t - first
                if w.message and w.message != ep2["message"]:
                    ep2["clear_message"] = w.message


AFTER_END_S: Final = 0.01
"""How soon after another request's end a request counts as sent because it ended (a
closed loop through a proxy on one host: 0.2–5 ms here)."""


def _arrival(c: _Collector, begin: float, span: float) -> dict[str, Any]:
    """Arrival rates over the recording's span (``span``: the seconds the throughput rates
    divide by, so the mean is THROUGHPUT's requests/s): the mean, the busiest 10 s and
    busiest second (windows from the start; a last partial window joins the one before,
    so every rate is over at least the window's length and the mean never exceeds a
    peak), and the dispersion index of arrivals per second. ``busy_s`` is the part of the
    span the requests ran in (the first one's start to the last one's end, inside the
    span), ``rps_busy`` the mean arrival rate over it: the load itself, whatever idle time
    the recording had before or after it (a comparison judges the load by it).
    ``after_end_share`` is the share of requests sent as another ended (within a
    twentieth of the mean time between requests, and 10 ms): about 1 − c/n in a closed
    loop of c clients (each sends its next request when its last one ends), a twentieth or
    less for arrivals that do not wait on the server (Poisson: 1 − e^−0.05 at most).
    ``dispersion_busy`` is the dispersion index over the whole seconds from the first
    arrival to the last (``dispersion_index`` counts the span's idle seconds too)."""
    n = len(c.starts)
    if n == 0:
        return {"rps_mean": None, "rps_peak_1s": None, "rps_peak_10s": None,
                "dispersion_index": None, "span_s": span, "busy_s": None, "rps_busy": None,
                "after_end_share": None, "dispersion_busy": None}
    starts = np.frombuffer(c.starts, dtype=np.float64)
    t = np.clip(starts - begin, 0.0, span)
    ends = np.clip(np.frombuffer(c.ends, dtype=np.float64) - begin, 0.0, span)
    busy = float(ends.max() - t.min()) if len(ends) else 0.0
    after_end = None
    if len(ends) == n and n > 1 and busy > 0:
        window = min(AFTER_END_S, 0.05 * busy / n)
        e = np.sort(np.frombuffer(c.ends, dtype=np.float64))
        i = np.searchsorted(e, starts, side="right")
        gap = starts - e[np.maximum(i - 1, 0)]
        after_end = float(np.count_nonzero((i > 0) & (gap <= window)) / n)
    # the dispersion of the arrivals themselves: whole seconds from the first start to the
    # last (the span's idle time before and after them would read as bursts)
    whole = int((t.max() - t.min()) // 1.0)
    per_s = np.bincount(((t - t.min()) // 1.0).astype(np.int64), minlength=whole + 1)[:whole]
    busy_disp = (float(per_s.var() / per_s.mean()) if whole > 1 and per_s.mean() > 0
                 else None)

    def per_window(width: float) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        k = max(1, int(span // width))
        counts = np.bincount(np.minimum((t // width).astype(np.int64), k - 1), minlength=k)
        lens = np.full(k, width)
        lens[-1] = span - width * (k - 1)
        return counts, lens

    c1, l1 = per_window(1.0)
    c10, l10 = per_window(10.0)
    full = c1[l1 == 1.0]  # whole seconds only, for the dispersion
    mean1 = float(full.mean()) if len(full) else 0.0
    return {
        "rps_mean": n / span,
        "rps_peak_1s": float((c1 / l1).max()),
        "rps_peak_10s": float((c10 / l10).max()),
        # variance/mean of arrivals per second: ≈1 Poisson, ≫1 bursty, ≈0 constant rate
        "dispersion_index": float(full.var() / mean1) if mean1 > 0 and len(full) > 1 else None,
        "span_s": span,
        "busy_s": busy if busy > 0 else None,
        "rps_busy": n / busy if busy > 0 else None,
        "after_end_share": after_end,
        "dispersion_busy": busy_disp,
    }


def _per(count: Any, arrival: Mapping[str, Any]) -> float | None:
    """``count`` over the arrival's ``busy_s`` (None without either)."""
    busy = arrival.get("busy_s")
    if not isinstance(count, int | float) or not isinstance(busy, int | float) or busy <= 0:
        return None
    return float(count) / busy


def _before_start(c: _Collector, started: Any) -> dict[str, Any]:
    """``requests_before_start``: requests that began before the recording did (one started
    mid-traffic, with ``POST /llmtop/v1/recording``, or a rotated part read alone), and
    ``first_start_at``, the earliest start. The rates run over the recording's span (from
    its ``started_at``: :class:`~llmtop.recording.replay.ReplayEngine`'s ``begin``) and count
    only the output those requests streamed inside it; the report says so. (They ran from
    the first request read and counted every token of those requests — against a span
    missing the requests that ended before the recording began: 61 s at 129 tok/s,
    started 2.6 s in, read 88 tok/s; two long streams begun 2 s before a 4.4 s recording
    of 199 tok/s read 234.)"""
    if not isinstance(started, int | float) or not len(c.starts):
        return {"requests_before_start": 0, "first_start_at": c.first_start}
    n = int(np.count_nonzero(np.frombuffer(c.starts, dtype=np.float64) < started))
    return {"requests_before_start": n, "first_start_at": c.first_start}


def _by_concurrency(c: _Collector, slo: Slo) -> list[dict[str, Any]]:
    stats = group_stats(c.conc_table, PCTS)
    m_ttft, m_itl, m_e2e = METRICS.index("ttft"), METRICS.index("itl"), METRICS.index("e2e")

    def p(metric: int, series: int, j: int) -> float | None:
        i = stats.lookup(metric, series)
        return None if i is None else int(stats.values[i, j]) / 1e6

    rows = []
    for s in np.flatnonzero(c.conc_counters[:, C_REQ]):
        if s < _CONC_BASE:
            continue
        conc = int(s) - _CONC_BASE
        cnt = c.conc_counters[s]
        n = int(cnt[C_REQ])
        judged = int(cnt[C_JUDGED])
        e2e = float(c.conc_e2e[s])
        # Little's law, as the capacity estimate: c in flight × tokens per request-second
        tps = conc * float(cnt[C_OUT_DONE]) / e2e if e2e > 0 and conc > 0 else None
        good = conc * float(cnt[C_GOOD]) / e2e if e2e > 0 and conc > 0 else None
        rows.append({
            "concurrency": conc,
            "requests": n,
            "judged": judged,
            # as ``outcomes`` counts them (a cancel is no error: not ok was 16 "errors"
            # beside outcomes' 12, its 4 cancellations among them)
            "errors": int(cnt[COUNTERS.index("errors")]),
            "timeouts": int(cnt[COUNTERS.index("timeouts")]),
            "cancelled": int(cnt[COUNTERS.index("cancelled")]),
            "slo_attainment": int(cnt[C_MET]) / judged if judged else None,
            "meets_target": (int(cnt[C_MET]) / judged >= slo.target) if judged else None,
            "ttft_p50": p(m_ttft, int(s), 0),
            "ttft_p95": p(m_ttft, int(s), 2),
            "itl_p50": p(m_itl, int(s), 0),
            "itl_p95": p(m_itl, int(s), 2),
            "e2e_p95": p(m_e2e, int(s), 2),
            "output_tps": tps,
            "goodput_tps": good,
        })
    return rows


def _distributions(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """Log-binned histograms of each latency over the session, from the snapshot's HDR
    histograms (for the distribution plots)."""
    out: dict[str, Any] = {}
    for name, text in (snapshot.get("histograms") or {}).items():
        idx, counts = decode_sparse(text) if text else (np.empty(0, np.int64),) * 2
        if len(idx) == 0:
            out[name] = {"edges_s": [], "counts": []}
            continue
        values = np.maximum(HIGHEST_EQ[idx], 1) / 1e6
        lo, hi = float(values.min()), float(values.max())
        if hi <= lo:
            hi = lo * 1.01 + 1e-6
        edges = np.geomspace(lo * 0.999, hi * 1.001, 41)
        hist, _ = np.histogram(values, bins=edges, weights=counts)
        out[name] = {"edges_s": edges.tolist(), "counts": hist.astype(int).tolist()}
    return out


def _series_point(s: Mapping[str, Any], begin: float, window_s: int) -> dict[str, Any]:
    sy, lat = s["system"], s["latency"]
    return {
        "t": float(s["time"]) - begin,
        "window_s": window_s,
        "rps": sy["rps"], "output_tps": sy["output_tps"], "input_tps": sy["input_tps"],
        "goodput_tps": sy["goodput_tps"], "slo_attainment": sy["slo_attainment"],
        # errors and timeouts apart, as ``outcomes`` and the by-concurrency rows count
        # them (this point's "errors" held both: three meanings of one word in one report)
        "requests": sy["requests"], "errors": sy["errors"], "timeouts": sy.get("timeouts", 0),
        "in_flight_mean": sy.get("in_flight_mean"), "in_flight_max": sy.get("in_flight_max"),
        "waiting_mean": sy.get("waiting_mean"),
        **{f"{m}_{q}": lat[m][q] for m in METRICS for q in ("p50", "p95", "p99")},
    }


def _bucketed(buckets: Mapping[int, list[float | None]], begin: float, step: float,
              names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Per-second maxima → per-step maxima (bounded points for the plots)."""
    rows: dict[int, list[float | None]] = {}
    for sec, vals in buckets.items():
        k = math.floor((sec - begin) / step)
        row = rows.setdefault(k, [None] * len(names))
        for i, v in enumerate(vals):
            if v is not None and (row[i] is None or v > row[i]):  # type: ignore[operator]
                row[i] = v
    ks = sorted(rows)
    out: dict[str, list[Any]] = {"t": [k * step for k in ks]}
    for i, n in enumerate(names):
        out[n] = [rows[k][i] for k in ks]
    return out


def _replay(eng: ReplayEngine, c: _Collector) -> tuple[list[dict[str, Any]], int, int]:
    """Play the whole recording: (time-series snapshots, their step and window). A snapshot
    every `step` s of recording time over a window of `window` s, at the finest of
    ``_STEPS`` that keeps the recording within ``MAX_SERIES_POINTS`` (the coarsest if
    none does), and a last one at the last event.

    Each step is sampled from the start while it still could be the one kept (a coarser
    one's points are not made from a finer one's: thinning 10 s windows to one a minute
    left five sixths of the recording in no point, and the peak rate mixed 10 s and 300 s
    windows)."""
    begin = eng.begin
    levels = [_Level(step, window, begin) for step, window in _STEPS]

    def on_tick(now: float) -> None:
        live = [lv for lv in levels if not lv.full]
        if not live:  # (the coarsest is never full: it is kept whatever its length)
            return
        snaps: dict[int, dict[str, Any]] = {}
        for lv in live:
            lv.tick(now, lambda w: snaps.setdefault(w, _series_point(eng.snapshot(w), begin, w)))
        for lv in live[:-1]:
            if len(lv.points) > MAX_SERIES_POINTS:
                lv.full = True
                lv.points = []  # (not kept: a coarser step will be)

    eng.run_to_end(on_tick)
    kept = next(lv for lv in levels if not lv.full)
    series = kept.points
    # a last point at the last event: the stretch after the last whole step was in no
    # point (a 7.1 s recording at 176.7 tok/s read "158.4 tok/s peak"; a day-long one
    # whose last burst came after its last step, none of it). Its window reaches back
    # `window` s from the end (the whole recording when shorter), as every point's does.
    end = eng.now - begin
    if not series or series[-1]["t"] < end:
        series.append(_series_point(eng.snapshot(kept.window), begin, kept.window))
    c.flush()
    return series, kept.step, kept.window


class _Level:
    """One step of the time series: its points so far and when the next is due."""

    __slots__ = ("begin", "full", "next_snap", "points", "step", "window")

    def __init__(self, step: int, window: int, begin: float) -> None:
        self.step = step
        self.window = window
        self.begin = begin
        self.next_snap = (math.floor(begin / step) + 1) * step
        """On multiples of ``step`` in unix time: the aggregator's interval edges (2 s
        fine, 10 s coarse), where a window covers exactly its length (off them a "10 s"
        window covered 10 to 12 s, a "60 s" one 60 to 70 s, as the recording's start
        fell)."""
        self.points: list[dict[str, Any]] = []
        self.full = False
        """More points than MAX_SERIES_POINTS: no longer sampled, nor kept."""

    def tick(self, now: float, point: Callable[[int], dict[str, Any]]) -> None:
        step = self.step
        if now - self.next_snap > 2 * step:  # after an idle stretch the replay crossed at once
            self.next_snap = math.floor(now / step) * step
        while now >= self.next_snap:
            self.points.append(point(self.window))
            self.next_snap += step


def analyse(
    path: Source,
    *,
    slo: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    tick_s: float = 1.0,
    top_users: int = 50,
    slowest: int = SLOWEST,
) -> dict[str, Any]:
    """Read the recording (twice when it holds requests longer than the replay's read-ahead)
    and build the report dict (see the module docstring).

    ``slo`` overrides the recording's objectives (keys ``ttft_s``, ``itl_p95_s``,
    ``tpot_s``, ``e2e_s``, ``target``; ``None`` unsets one). ``slowest``: how many
    requests each slowest list names.
    A rotated recording's stem (or its :class:`~llmtop.recording.parts.Series`) is read
    whole, its parts as one recording.
    """
    path = resolve(path) if isinstance(path, str | Path) else path  # (once, not per pass)
    eff_slo = Slo.from_config(config_for(read_header(path), slo))
    lookahead = DEFAULT_LOOKAHEAD_S
    while True:
        c = _Collector(eff_slo, slowest)
        eng = ReplayEngine(path, slo=slo, tick_s=tick_s, top_users=top_users,
                           progress=progress, observer=c, lookahead_s=lookahead)
        series, step, window = _replay(eng, c)
        if not eng.late_starts or eng.lookahead_s <= lookahead:
            break
        # requests longer than the read-ahead were started late (their tokens in one
        # tick): once more, reading as far ahead as the longest one
        lookahead = eng.lookahead_s
        eng.close()
    header = eng.header
    started = header.get("started_at")
    begin = eng.begin


    final = eng.snapshot(None)
    reader = eng.reader
    footer = reader.footer
    duration = max(0.0, (c.last_t if c.last_t is not None else begin) - begin)
    sysf = final["system"]
    lat = final["latency"]
    series_tps = [p["output_tps"] for p in series if p["output_tps"] is not None]
    plot_step = max(1.0, duration / MAX_SERIES_POINTS)
    span = float(sysf.get("span_s") or max(duration, 1.0))

    conditions = {
        "upstream": header.get("upstream"),
        "models": dict(c.models.most_common()),
        "models_ok": dict(c.models_ok.most_common()),
        "dialects": dict(c.dialects.most_common()),
        "paths": dict(c.paths.most_common(10)),
        "slo": eff_slo.as_dict(),
        "slo_from_recording": dict(header.get("slo") or {}),
        "started_at": started,
        "ended_at": footer.get("ended_at") if footer else None,
        "first_event_at": c.first_t,
        "last_event_at": c.last_t,
        "duration_s": duration,
        "requests": c.requests,
        "streaming_share": c.streaming / c.requests if c.requests else None,
        "prompt_tokens": c.prompt.summary(),
        "completion_tokens": c.completion.summary(),
        "token_source": dict(c.token_sources),
        "concurrency_at_start": c.conc.summary(),
        "in_flight": in_flight(c.starts, c.ends, c.firsts, begin, span, series),
        **_before_start(c, started),
        "arrival": _arrival(c, begin, span),
        "gpus": [f"{g['index']}: {g['name']}" + (" (simulated)" if g["simulated"] else "")
                 for g in sorted(c.gpus.values(), key=lambda g: g["index"])],
        "engine_kind": c.engine["kind"],
        "llmtop_version": header.get("llmtop_version"),
        "extra": {k: v for k, v in header.items()
                  if k not in ("type", "format", "version", "started_at", "upstream", "slo",
                               "llmtop_version")},
    }
    errors = c.outcomes.get("error", 0)
    timeouts = c.outcomes.get("timeout", 0)
    cancelled = c.outcomes.get("cancelled", 0)
    report: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "source": {
            "file": shown_name(source_path(path)),
            "path": str(source_path(path)),
            "format_version": header.get("version"),
            "complete": reader.complete,
            "truncated_lines": reader.truncated_lines,
            "bad_lines": reader.bad_lines,
            "unknown_lines": reader.unknown_lines,
            "defaulted_lines": reader.defaulted_lines,
            "problems": list(reader.problems),
            "gzip_damage": reader.summary()["gzip_damage"],
            **recorder_counts(footer),
            "events": reader.events_read,
            # (a rotated recording's stem: which of its series was read, 1 = the oldest)
            **({"series": path.index} if isinstance(path, Series) else {}),
        },
        "conditions": conditions,
        "latency": {m: dict(lat[m]) for m in METRICS},
        "percentiles": PERCENTILE_NOTE,
        "throughput": {
            "output_tps": sysf["output_tps"],
            "input_tps": sysf["input_tps"],
            "rps": sysf["rps"],
            "output_tps_peak": max(series_tps) if series_tps else None,
            "output_tokens": sysf.get("output_tokens"),
            "input_tokens": sysf.get("input_tokens"),
            "span_s": sysf.get("span_s"),
            # the same tokens over the time the requests ran (arrival's busy_s): the load's
            # own rate, whatever idle time the recording had around it
            "output_tps_busy": _per(sysf.get("output_tokens"), conditions["arrival"]),
            "series_step_s": step,
            "series_window_s": window,
        },
        "outcomes": {
            "requests": c.requests,
            "ok": c.outcomes.get("ok", 0),
            "errors": errors,
            "timeouts": timeouts,
            "cancelled": cancelled,
            "error_rate": errors / c.requests if c.requests else None,
            "timeout_rate": timeouts / c.requests if c.requests else None,
            "statuses": {str(k): v for k, v in sorted(c.statuses.items())},
            "top_errors": [{"error": m, "count": n} for m, n in c.error_messages.most_common(5)],
            "other_errors": sum(c.error_messages.values())
            - sum(n for _, n in c.error_messages.most_common(5)),
        },
        "slo": {
            **eff_slo.as_dict(),
            "attainment": sysf["slo_attainment"],
            "met": sysf.get("slo_met"),
            "goodput_rps": sysf["goodput_rps"],
            "goodput_tps": sysf["goodput_tps"],
            "target_met": (sysf["slo_attainment"] >= eff_slo.target
                           if sysf["slo_attainment"] is not None else None),
        },
        "capacity": dict(final["capacity"]),
        "users": final["users"],
        "models": final.get("models", []),
        "by_concurrency": _by_concurrency(c, eff_slo),
        "warnings": c.warnings,
        "gpus": [c.gpus[i] for i in sorted(c.gpus)],
        "engine": {**c.engine, "ttft_p95": (final.get("engine") or {}).get("ttft_p95")},
        "series": series,
        "gpu_series": {str(i): _bucketed(b, begin, plot_step,
                                         ("mem_used_bytes", "dram_bw_util", "mem_busy"))
                       for i, b in sorted(c.gpu_buckets.items())},
        "engine_series": _bucketed(c.engine_buckets, begin, plot_step,
                                   ("running", "waiting", "kv_cache_usage")),
        "distributions": _distributions(final),
        "slowest": c.slowest.as_dict(),
    }
    eng.close()
    out: dict[str, Any] = _plain(report)
    return out


def _plain(obj: Any) -> Any:
    """numpy scalars → Python numbers, NaN/inf → None (JSON-safe)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


_FD_DIRS: Final = (Path("/dev/fd"), Path("/proc/self/fd"))


def shown_name(path: Path) -> str:
    """The name a report gives its recording: the file's name, or the whole path for a
    descriptor (``llmtop report <(ssh gpu1 cat today.jsonl.gz)`` reads ``/dev/fd/63``,
    whose name alone titled the report "llmtop report — 63")."""
    return str(path) if path.parent in _FD_DIRS else path.name
