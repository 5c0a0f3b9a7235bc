"""``GET /metrics``: a prometheus_client collector reading the aggregator at scrape time.

Nothing is counted twice: :class:`LlmtopCollector.collect` builds every family from the
aggregator's cumulative ("all") window, its live registry and its latest readings. It is
registered in a private ``CollectorRegistry`` (never the global one), so several
aggregators can live in one process (tests, workers).

Families (all prefixed ``llmtop_``):

- counters: ``requests_total{outcome}``, ``output_tokens_total`` (of finished requests),
  ``input_tokens_total``, ``slo_met_requests_total``, ``slo_judged_requests_total`` (the
  attainment's denominator: ``slo_met`` ÷ ``slo_judged``), ``goodput_output_tokens_total``,
  ``clamped_latency_values_total``; per user ``user_requests_total{user,outcome}``,
  ``user_output_tokens_total{user}``; per model ``model_requests_total{model,outcome}``,
  ``model_output_tokens_total{model}``;
- gauges: ``in_flight``, ``waiting``, ``streaming``, ``user_in_flight{user}``;
  ``slo_attainment``, ``goodput_rps``, ``goodput_tps``, ``output_tps``, ``rps`` over the
  last 60 s (label ``window="60"``), ``user_slo_attainment{user}`` and
  ``user_output_tps{user}`` likewise; ``capacity_max_concurrency_at_slo``,
  ``capacity_goodput_tps_at_slo`` (absent until estimated); GPU and engine readings
  (absent when unavailable, and once they are no longer current: the engine's when its
  scrapes have been failing a while, :func:`llmtop.engines.scraper.current_for_s`; a
  GPU's, :func:`gpu_current_for_s`); ``warning_active{code}`` (1
  raised, else 0; every code of the saturation detectors is present from the start);
- histograms (seconds): ``ttft_seconds``, ``itl_seconds``, ``chunk_gap_seconds``,
  ``tpot_seconds``, ``e2e_seconds``; ``user_ttft_seconds{user}``, ``user_itl_seconds{user}``.
  Buckets come from the cumulative HDR counts: ``le=b`` counts every HDR bucket whose
  lowest value is ≤ b (within the histogram's 0.1% precision); ``_sum`` uses bucket
  midpoints.

The ``user`` label only takes the bounded top-N set plus ``other``; ``model`` likewise.
``other`` is always the fold: a tracked user (or model) named ``other`` is labelled
``other_`` (and ``other_`` ``other__``, and so on: :func:`llmtop.metrics.labels.label_value`).
``model="unknown"`` is the requests that named no model (or a blank name); a model named
``unknown`` is ``unknown_`` (:func:`llmtop.metrics.labels.model_label`), as in the snapshot.
Label values are data: the exposition format escapes them; lone surrogates (text that
was not UTF-8) become U+FFFD, so no name can make the scrape fail.

A scrape is two steps: :meth:`LlmtopCollector.families` reads the aggregator (on its loop)
into plain columns, and :func:`llmtop.metrics.promtext.encode` writes them as text (pure:
any thread); :meth:`LlmtopCollector.exposition` does both. ``collect`` gives
prometheus_client's own families for the same columns, whose encoders write the same bytes
at several times the cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from llmtop.engines.scraper import current_for_s
from llmtop.events import OPERATIONAL_CODES, WARNING_CODES, EngineReading
from llmtop.metrics import capacity
from llmtop.metrics.hdr import COUNTS_LEN, bucket_index
from llmtop.metrics.ingest import (
    C_CANC,
    C_ERR,
    C_GOOD,
    C_IN,
    C_JUDGED,
    C_MET,
    C_OK,
    C_OUT,
    C_OUT_DONE,
    C_REQ,
    C_TMO,
    M_ITL,
    M_TTFT,
    METRICS,
)
from llmtop.metrics.promtext import (
    Family,
    Histograms,
    Kind,
    add_histogram,
    encode,
    to_metrics,
)
from llmtop.metrics.table import SplitTable, group_id

if TYPE_CHECKING:
    from llmtop.metrics.aggregator import Aggregator

__all__ = ["BUCKETS", "LlmtopCollector", "add_histogram", "gpu_current_for_s", "hdr_histograms",
           "make_registry"]

TTFT_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0,
                         1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""TTFT: milliseconds (cache hits, short prompts) to minutes (queues, long prefill)."""
ITL_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
                        0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
"""ITL, chunk gap, TPOT: sub-millisecond (speculative decoding) to seconds (stalls)."""
E2E_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0,
                        7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0, 45.0, 60.0, 90.0, 120.0,
                        180.0, 240.0, 300.0, 450.0, 600.0, 900.0, 1200.0, 1800.0)
"""E2E: short answers (tenths of a second) to long generations (half an hour), no bound
more than ~1.5× the one below it from 0.5 s on, so ``histogram_quantile`` stays within
about 20 % where most completions end (1-30 s); a system-wide family only (no per-user
series), so the extra bounds cost a few lines per scrape."""
BUCKETS: Final = {"ttft": TTFT_BUCKETS_S, "itl": ITL_BUCKETS_S, "chunk_gap": ITL_BUCKETS_S,
                  "tpot": ITL_BUCKETS_S, "e2e": E2E_BUCKETS_S}
_OUTCOMES: Final = (("ok", C_OK), ("error", C_ERR), ("cancelled", C_CANC), ("timeout", C_TMO))
_BOUND_IDX: Final = {name: bucket_index(np.rint(np.array(b) * 1e6).astype(np.int64))
                     for name, b in BUCKETS.items()}
_LES: Final = {name: tuple(repr(float(b)) for b in bounds) for name, bounds in BUCKETS.items()}
"""The ``le`` label values of each histogram's finite bounds."""
_P = "llmtop_"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _utf8(value: str) -> str:
    """``value`` as a label value the exposition can encode: lone surrogates (bytes that
    were not UTF-8, a JSON ``\\udcff`` escape) become U+FFFD, one each. One such value
    made ``generate_latest`` raise, failing every scrape; the check costs an ``isascii``
    for the usual names."""
    if value.isascii():
        return value
    return _SURROGATE.sub("\ufffd", value)


def hdr_histograms(split: SplitTable, metric: int, series: Sequence[int], name: str,
                   label: str | None = None, values: Sequence[str] = ()) -> Histograms:
    """Cumulative Prometheus buckets and the sum (seconds) of HDR histograms, one per
    series (labelled ``label=values[i]``), vectorised over the series."""
    groups = np.array([group_id(metric, s) for s in series], dtype=np.int64)
    if len(groups) == 0:
        return Histograms(label, [], _LES[name], [], [], [])
    before, totals = split.group_totals(groups)
    keys = groups[:, None] * COUNTS_LEN + _BOUND_IDX[name][None, :]
    cum = split.count_le(keys.ravel()).reshape(keys.shape) - before[:, None]
    sums = split.group_sums_us(groups) / 1e6
    return Histograms(label, list(values), _LES[name], cum.tolist(), totals.tolist(),
                      [float(s) for s in sums.tolist()])


_HELP = {
    "ttft": "Time to first token, seconds, as clients saw it",
    "itl": "Inter-token latency (a chunk's gap spread over its tokens), seconds",
    "tpot": "Time per output token after the first, per request, seconds",
    "e2e": "End-to-end request latency, seconds",
    "chunk_gap": "Gap between consecutive content chunks, seconds",
}
"""HELP lines of the latency histograms (by metric name)."""


def _family(name: str, kind: Kind, doc: str, labels: tuple[str, ...] = (),
            value: float | None = None) -> Family:
    fam = Family(_P + name, kind, doc, labels)
    if value is not None:
        fam.rows.append(((), float(value)))
    return fam


class LlmtopCollector(Collector):
    """Builds llmtop's metric families from an :class:`Aggregator` at scrape time."""

    def __init__(self, aggregator: Aggregator) -> None:
        self.agg = aggregator

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        """prometheus_client's families (for a registry: :func:`make_registry`)."""
        return to_metrics(self.families())

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The scrape's body in the format ``accept`` asks for, and its Content-Type."""
        return encode(self.families(), accept)

    def families(self) -> list[Family]:
        """Every family, read from the aggregator now (plain values: they may be
        encoded on another thread while the aggregator goes on)."""
        agg = self.agg
        now = agg.clock()
        allv = agg.view(None, now)
        recent = agg.view(60, now)
        c = allv.counters
        c0 = c[0].tolist()
        # a real "other" is "other_" (the fold is "other")
        users = {sid: _utf8(n) for sid, n in agg.users.labels().items()}
        models = {sid: _utf8(n) for sid, n in agg.models.labels().items()}
        out: list[Family] = []

        req = _family("requests", "counter", "Finished requests by outcome", ("outcome",))
        req.rows += [((outcome,), float(c0[col])) for outcome, col in _OUTCOMES]
        out.append(req)
        for name, col, doc in (
            ("output_tokens", C_OUT_DONE, "Output tokens of finished requests"),
            ("input_tokens", C_IN, "Prompt tokens of finished requests"),
            ("slo_met_requests", C_MET, "Finished requests that met every SLO"),
            ("slo_judged_requests", C_JUDGED,
             "Finished requests SLO attainment counts (all but those cancelled while within "
             "every objective)"),
            ("goodput_output_tokens", C_GOOD, "Output tokens of requests that met every SLO"),
        ):
            out.append(_family(name, "counter", doc, value=c0[col]))
        out.append(_family("clamped_latency_values", "counter",
                           "Latency values outside 0 us..1 h, clamped (or NaN)",
                           value=agg.clamped))

        for label, slots, pre in (("user", users, "user_"), ("model", models, "model_")):
            fam = _family(pre + "requests", "counter", f"Finished requests by {label}",
                          (label, "outcome"))
            tok = _family(pre + "output_tokens", "counter",
                          f"Output tokens of finished requests by {label}", (label,))
            rows = c[list(slots)].tolist() if slots else []
            for name, row in zip(slots.values(), rows, strict=True):
                if not row[C_REQ]:
                    continue
                fam.rows += [((name, outcome), float(row[col])) for outcome, col in _OUTCOMES]
                tok.rows.append(((name,), float(row[C_OUT_DONE])))
            out += [fam, tok]

        per_user, (n, waiting, streaming) = agg.live_counts()
        out.append(_family("in_flight", "gauge", "Requests open at the proxy", value=n))
        out.append(_family("waiting", "gauge", "Open requests without a first token yet",
                           value=waiting))
        out.append(_family("streaming", "gauge", "Open requests streaming output",
                           value=streaming))
        uif = _family("user_in_flight", "gauge", "Open requests by user", ("user",))
        uif.rows += [((name,), float(per_user.get(sid, [0])[0])) for sid, name in users.items()]
        out.append(uif)

        out += self._window_gauges(recent.counters, max(recent.span_s, 1.0), users)
        out += self._histograms(allv.split, users)
        out += self._capacity()
        out += self._readings(now)
        return out

    def _window_gauges(self, c: np.ndarray, span: float,
                       users: dict[int, str]) -> list[Family]:
        out: list[Family] = []
        c0 = c[0].tolist()
        judged = float(c0[C_JUDGED])
        att = _family("slo_attainment", "gauge",
                      "Share of finished requests meeting every SLO (not counting "
                      "those cancelled while within every objective)", ("window",))
        if judged:
            att.rows.append((("60",), float(c0[C_MET]) / judged))
        out.append(att)
        for name, col, doc in (
            ("goodput_rps", C_MET, "Requests per second meeting every SLO"),
            ("goodput_tps", C_GOOD, "Output tokens per second of requests meeting every SLO"),
            ("output_tps", C_OUT, "Output tokens per second, all requests"),
            ("rps", C_REQ, "Finished requests per second"),
        ):
            g = _family(name, "gauge", doc, ("window",))
            g.rows.append((("60",), float(c0[col]) / span))
            out.append(g)
        uatt = _family("user_slo_attainment", "gauge", "SLO attainment by user (60 s)",
                       ("user",))
        utps = _family("user_output_tps", "gauge", "Output tokens per second by user (60 s)",
                       ("user",))
        rows = c[list(users)].tolist() if users else []
        for name, row in zip(users.values(), rows, strict=True):
            if row[C_JUDGED]:
                uatt.rows.append(((name,), float(row[C_MET]) / float(row[C_JUDGED])))
            utps.rows.append(((name,), float(row[C_OUT]) / span))
        return [*out, uatt, utps]

    def _histograms(self, split: SplitTable, users: dict[int, str]) -> list[Family]:
        out: list[Family] = []
        for m, name in enumerate(METRICS):
            fam = _family(name + "_seconds", "histogram",
                          _HELP.get(name, f"{name.upper()} seconds as clients saw them"))
            fam.hist = hdr_histograms(split, m, [0], name)
            out.append(fam)
        sids = list(users)
        for m, name in ((M_TTFT, "ttft"), (M_ITL, "itl")):
            fam = _family("user_" + name + "_seconds", "histogram",
                          f"{name.upper()} seconds by user", ("user",))
            h = hdr_histograms(split, m, sids, name, "user", list(users.values()))
            if 0 in h.totals:  # series with no value yet are left out
                keep = [i for i, t in enumerate(h.totals) if t]
                h = Histograms("user", [h.values[i] for i in keep], h.les,
                               [h.cum[i] for i in keep], [h.totals[i] for i in keep],
                               [h.sums[i] for i in keep])
            fam.hist = h
            out.append(fam)
        return out

    def _capacity(self) -> list[Family]:
        agg = self.agg
        est = capacity.estimate(agg.capacity.bins(), agg.slo.target)
        cap = _family("capacity_max_concurrency_at_slo", "gauge",
                      "Largest concurrency holding the SLO attainment target")
        good = _family("capacity_goodput_tps_at_slo", "gauge",
                       "Goodput (output tokens/s) at that concurrency")
        if est["max_concurrency_at_slo"] is not None:
            cap.rows.append(((), float(est["max_concurrency_at_slo"])))
        if est["goodput_tps_at_slo"] is not None:
            good.rows.append(((), float(est["goodput_tps_at_slo"])))
        return [cap, good]

    def _readings(self, now: float) -> list[Family]:
        agg = self.agg
        out: list[Family] = []
        gauges: Sequence[tuple[str, str, str]] = (
            ("gpu_memory_used_bytes", "mem_used_bytes", "GPU memory used"),
            ("gpu_memory_total_bytes", "mem_total_bytes", "GPU memory total"),
            ("gpu_utilization_percent", "util_gpu", "Share of time a kernel ran (%)"),
            ("gpu_memory_busy_percent", "mem_busy",
             "Share of time memory was read or written (%), not bandwidth"),
            ("gpu_dram_bandwidth_percent", "dram_bw_util", "DRAM bandwidth, % of peak (GPM)"),
            ("gpu_power_watts", "power_w", "GPU power draw"),
            ("gpu_temperature_celsius", "temperature_c", "GPU temperature"),
        )
        gpu_limit = gpu_current_for_s(agg.cfg.gpu.interval_s)
        current = [i for i in sorted(agg.gpus) if now - agg.gpus[i].t <= gpu_limit]
        for name, field, doc in gauges:
            fam = _family(name, "gauge", doc, ("gpu", "name"))
            for i in current:
                g = agg.gpus[i]
                v = getattr(g, field)
                if v is not None and np.isfinite(v):
                    fam.rows.append(((str(i), _utf8(g.name)), float(v)))
            out.append(fam)
        e = agg.engine
        if e is not None and not _current(agg, e, now):
            e = None  # its scrapes have been failing: absent, not the last value for good
        for name, field, doc in (
            ("engine_running", "running", "Requests the engine reports running"),
            ("engine_waiting", "waiting", "Requests the engine reports queued"),
            ("engine_kv_cache_usage_ratio", "kv_cache_usage", "Engine KV-cache usage (0-1)"),
            ("engine_preemptions", "preemptions", "Engine preemptions so far (its counter)"),
        ):
            fam = _family(name, "gauge", doc, ("kind",))
            v = None if e is None else getattr(e, field)
            if e is not None and v is not None and np.isfinite(v):
                fam.rows.append(((_utf8(e.kind),), float(v)))
            out.append(fam)
        warn = _family("warning_active", "gauge",
                       "1 while the warning named by code is raised, else 0 "
                       "(saturation detectors and operational codes alike)", ("code",))
        # every known code from the start (0 = not raised), so "no warning" and "no data"
        # differ and absent()-style alerts work
        for code in sorted(set(agg.warning_codes) | set(WARNING_CODES) | set(OPERATIONAL_CODES)):
            warn.rows.append(((code,), 1.0 if code in agg.warnings else 0.0))
        out.append(warn)
        out.append(_family("uptime_seconds", "gauge", "Seconds since the aggregator started",
                           value=max(0.0, now - agg.started_at)))
        return out


GPU_CURRENT_MIN_S: Final = 10.0
"""A GPU reading stands for the device's state at least this long (:func:`gpu_current_for_s`)."""


def gpu_current_for_s(interval_s: float) -> float:
    """How long after it was taken a GPU reading is exported: 10 sampling intervals, at
    least :data:`GPU_CURRENT_MIN_S`. NVML readings keep coming while a device is lost or
    its calls hang (every value None: absent), but the simulated GPU is read over HTTP
    from the simulator's ``/sim/gpu``: once that stopped answering, its last reading was
    exported for good, a flat line in Prometheus (the snapshot has ``age_s``)."""
    return max(GPU_CURRENT_MIN_S, 10 * interval_s)


def _current(agg: Aggregator, e: EngineReading, now: float) -> bool:
    """Whether the engine reading ``e`` still stands for the engine's state at ``now``
    (:func:`llmtop.engines.scraper.current_for_s`). Before, the last reading of an engine
    whose ``/metrics`` then failed was exported for good: a flat line in Prometheus, and a
    KV-cache alert firing on a number nobody had read for minutes."""
    h = agg.engine_history
    gap = h[-1].t - h[-2].t if len(h) > 1 else 0.0
    return now - e.t <= current_for_s(agg.cfg.engine.interval_s, gap)


def make_registry(aggregator: Aggregator) -> CollectorRegistry:
    """A private registry holding only llmtop's collector for ``aggregator``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LlmtopCollector(aggregator))
    return reg
