"""Building the admin API's snapshot JSON (``shared/docs/interfaces.md``) from an aggregator.

Fields beyond the documented ones (extensions; the documented ones never change meaning):

- top level: ``host``, ``upstream``, ``started_at``, ``uptime_s``, ``slo`` (the objectives
  and target), ``top_users``, ``clamped_values``, ``models`` (per-model rows like users),
  ``series`` (one point per 2 s over the last 5 min for the time plots: ``t``, ``rps``,
  ``output_tps``, ``input_tps``, ``goodput_tps``, ``errors``, ``requests``, ``slo_met``,
  ``in_flight``/``waiting``/``streaming`` (means of the samples), ``ttft_p95``,
  ``itl_p95``);
- ``system`` and ``users[*]``: ``slo_judged``, the requests ``slo_attainment`` is taken
  over (all but those cancelled while within every objective: :mod:`llmtop.metrics.slo`);
- ``system``: ``timeouts``, ``ok``, ``slo_met``, ``output_tokens``, ``input_tokens``,
  ``span_s`` (the seconds the rates are divided by: the time the window really covers —
  the time since the aggregator started until the window is full, then 10–12, 60–70 or
  300–310 s —, at least 1: the first second reads low rather than a request in its first
  10 ms reading 100/s), ``in_flight_mean``/``_max``, ``waiting_mean``/``_max``,
  ``streaming_mean``;
- ``latency.*``: ``mean``; ``users[*]``: ``waiting``, ``streaming``, ``rps``,
  ``input_tps``, ``errors``, ``cancelled``, ``timeouts``, ``slo_met``, ``goodput_rps``,
  ``goodput_tps``, ``finished_output_tps`` (output tokens per second of the requests that
  finished in the window, counted when they finish, as goodput is: goodput_tps is at most
  this, while it can exceed ``output_tps``, the tokens streamed in the window, when long
  answers finish), ``output_tokens``, ``ttft_p50``/``p99``, ``itl_p50``/``p99``,
  ``tpot_p95``, ``e2e_p95``, ``tracked`` and, on request, ``histograms`` (ttft, itl,
  chunk_gap, tpot, e2e) for exact merging; ``models[*]``: ``tracked`` too. ``tracked`` is
  false only for the row of every user (model) past the top N, named ``other``: a real
  user named ``other`` has a row of its own, also named ``other``, with ``tracked`` true
  (:mod:`llmtop.metrics.labels`);
- ``gpus[*]``: every GpuReading field, ``host``, ``age_s``;
- ``engine``: ``preemptions``, ``t``, ``age_s``, ``ttft_p95`` (seconds, from the engine's
  own TTFT histogram over the window, interpolated within buckets as Prometheus does);
- ``capacity``: see :mod:`llmtop.metrics.capacity` (``bins`` make it mergeable);
- ``warnings[*]``: as documented.

Latency values are seconds; ``None`` where there is no data.

Every counter holds only what happened since the aggregator started: a replay of a recording
started mid-traffic starts it at the recording's start, with the requests open then carried
in (:meth:`~llmtop.metrics.aggregator.Aggregator.carry_in`), and no counter — output, finished
or good tokens, input tokens — holds what they streamed, or the prompts they sent, before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from llmtop.events import EngineReading, GpuReading, finite_or_none
from llmtop.metrics.hdr import encode_many
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
    M_E2E,
    M_ITL,
    M_TPOT,
    M_TTFT,
    METRICS,
)
from llmtop.metrics.table import SERIES_SPAN, SplitTable, group_id
from llmtop.metrics.windows import WINDOWS

if TYPE_CHECKING:
    from llmtop.metrics.aggregator import Aggregator
    from llmtop.metrics.slo import Slo

VERSION: Final = 1
_ROW_METRICS: Final = (M_TTFT, M_ITL, M_TPOT, M_E2E)
"""Metrics with per-user and per-model histograms (chunk gaps: system only)."""


SYSTEM_PS: Final = (50.0, 90.0, 95.0, 99.0)
"""Percentiles computed for the system's ``latency``; user and model rows take p50, p95 and
p99 of the same computation."""
_NO_SUMMARY: Final = {"count": 0, "p50": None, "p90": None, "p95": None, "p99": None,
                      "max": None, "mean": None}


def _percentiles(split: SplitTable, series: Sequence[int]
                 ) -> tuple[dict[str, dict[str, Any]], list[list[list[float | None]]]]:
    """The system's latency summaries — ``{name: {"count", "p50", "p90", "p95", "p99",
    "max", "mean"}}`` (seconds) for every metric — and, per row metric (``_ROW_METRICS``
    order), per series of ``series`` (same order), its values at :data:`SYSTEM_PS` in
    seconds (``None`` where it has no samples): one grouped query for all (each of its calls
    has a fixed cost that dominates at these sizes)."""
    n_sys, n_s = len(METRICS), len(series)
    groups = [m * SERIES_SPAN for m in range(n_sys)]
    groups += [m * SERIES_SPAN + sid for m in _ROW_METRICS for sid in series]
    g = split.group_summary(groups, SYSTEM_PS)
    rows: list[list[float | None]] = (g.values / 1e6).tolist()
    empty: list[float | None] = [None] * len(SYSTEM_PS)
    all_totals: list[int] = g.totals.tolist()
    for i, n in enumerate(all_totals):
        if not n:
            rows[i] = empty
    totals = all_totals[:n_sys]
    maxes: list[int] = g.maxes[:n_sys].tolist()
    # as numpy divides int64 arrays: both as floats (five values: no array calls)
    means = [float(s) / float(max(n, 1)) for s, n in zip(g.sums[:n_sys].tolist(), totals,
                                                       strict=True)]
    latency: dict[str, dict[str, Any]] = {}
    for j, name in enumerate(METRICS):
        if not totals[j]:
            latency[name] = dict(_NO_SUMMARY)
            continue
        p50, p90, p95, p99 = rows[j]
        latency[name] = {"count": totals[j], "p50": p50, "p90": p90, "p95": p95,
                         "p99": p99, "max": maxes[j] / 1e6, "mean": means[j] / 1e6}
    per_metric = [rows[n_sys + r * n_s:n_sys + (r + 1) * n_s]
                  for r in range(len(_ROW_METRICS))]
    return latency, per_metric


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Quantile from cumulative ``(upper bound, count)`` buckets, as PromQL's
    ``histogram_quantile`` (linear within a bucket; the +Inf bucket gives its lower bound)."""
    bs = sorted((float(le), float(c)) for le, c in buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    rank = q * bs[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return None


def _engine_ttft_p95(history: Sequence[EngineReading], window_s: int | None,
                     now: float, first: EngineReading | None = None) -> float | None:
    """The engine's TTFT P95 over the window: its histogram since the last reading at or
    before the window's start (the oldest kept when the session is younger than the
    window); over the session (``None``) since ``first``, the session's first reading with
    a histogram — without one, or with that reading the last, all the engine's counts."""
    if not history or not history[-1].ttft_buckets:
        return None
    last = history[-1]
    base = None
    if window_s is None:
        base = first if first is not last else None
    else:
        cut = now - window_s
        for e in reversed(history):  # the last reading at or before the window's start
            if e.t <= cut:
                base = e
                break
        if base is None:
            base = history[0] if history[0] is not last else None
    memo = _ttft_memo
    if memo[0] is last and memo[1] is base:
        return memo[2]
    value = _ttft_p95_between(last, base)
    _remember_ttft(last, base, value)
    return value


_ttft_memo: tuple[EngineReading | None, EngineReading | None, float | None] = (None, None, None)
"""The last engine TTFT P95 computed: its reading, the window's base reading, the value.
Readings are immutable, and scraped once a second while snapshots are built twice a second
per screen: every other build (and every other screen's) finds it here."""


def _remember_ttft(last: EngineReading, base: EngineReading | None,
                   value: float | None) -> None:
    global _ttft_memo  # one reference swapped whole: a reader sees one pair or the other
    _ttft_memo = (last, base, value)


def _ttft_p95_between(last: EngineReading, base: EngineReading | None) -> float | None:
    """P95 of the engine's TTFT histogram between two readings (since ``base``; all of
    ``last``'s when there is none, or when a count went down: an engine restart)."""
    cur = dict(last.ttft_buckets)
    if base is not None and base.ttft_buckets:
        old = dict(base.ttft_buckets)
        if all(cur.get(le, 0.0) >= c for le, c in old.items()):  # no engine restart
            cur = {le: c - old.get(le, 0.0) for le, c in cur.items()}
    return bucket_quantile(list(cur.items()), 0.95)


def gpu_row(g: GpuReading, host: str, now: float) -> dict[str, Any]:
    d = g.to_json_dict()
    d.pop("type", None)
    for k, v in d.items():
        if isinstance(v, float):
            d[k] = finite_or_none(v)
    d["host"] = host
    d["age_s"] = max(0.0, now - g.t)
    return d


def engine_section(agg: Aggregator, window_s: int | None, now: float) -> dict[str, Any]:
    """The engine's last scraped reading, with ``status``: the scraper's line (why there
    is no reading — "no /metrics at URL (HTTP 404)" — or which engine it reads; None when
    nothing scrapes)."""
    e = agg.engine
    status = agg.engine_status() if agg.engine_status is not None else None
    if e is None:
        return {"kind": None, "running": None, "waiting": None, "kv_cache_usage": None,
                "preemptions": None, "ttft_p95": None, "t": None, "age_s": None,
                "status": status}
    return {
        "status": status,
        "kind": e.kind,
        "running": finite_or_none(e.running),
        "waiting": finite_or_none(e.waiting),
        "kv_cache_usage": finite_or_none(e.kv_cache_usage),
        "preemptions": finite_or_none(e.preemptions),
        "ttft_p95": _engine_ttft_p95(agg.engine_history, window_s, now, agg.engine_first),
        "t": e.t,
        "age_s": max(0.0, now - e.t),
    }


_slo_memo: tuple[Slo | None, tuple[tuple[str, float], ...]] = (None, ())


def _slo_dict(slo: Slo) -> dict[str, float]:
    """``slo.as_dict()``, remembered for the last ``slo`` (the same object snapshot after
    snapshot; immutable): its ``dataclasses.asdict`` deep-copies field by field."""
    global _slo_memo  # one reference swapped whole, as _ttft_memo
    memo = _slo_memo
    if memo[0] is not slo:
        memo = _slo_memo = (slo, tuple(slo.as_dict().items()))
    return dict(memo[1])


def _rates(c: Sequence[int], span: float) -> dict[str, Any]:
    """Counts and per-second rates of one series' counter row (a list of ints)."""
    req, met, judged = c[C_REQ], c[C_MET], c[C_JUDGED]
    return {
        "requests": req,
        "rps": req / span,
        "output_tps": c[C_OUT] / span,
        "input_tps": c[C_IN] / span,
        "errors": c[C_ERR],
        "cancelled": c[C_CANC],
        "timeouts": c[C_TMO],
        "slo_met": met,
        "goodput_rps": met / span,
        "goodput_tps": c[C_GOOD] / span,
        "finished_output_tps": c[C_OUT_DONE] / span,
        "slo_judged": judged,
        "slo_attainment": (met / judged) if judged else None,
        "output_tokens": c[C_OUT],
    }


def build_snapshot(agg: Aggregator, window_s: int | None,
                   *, user_histograms: bool = False, capacity_bins: bool = True,
                   histograms: bool = True) -> dict[str, Any]:
    """The snapshot dict of ``agg`` over ``window_s`` (10, 60, 300 or ``None`` = all).
    ``capacity_bins=False`` leaves ``capacity.bins`` out (one per concurrency level seen:
    a thousand after a soak, most of the snapshot's JSON; only merging needs them)."""
    if window_s is not None and window_s not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS} or None, got {window_s!r}")
    now = agg.clock()
    view = agg.view(window_s, now)
    span = max(view.span_s, 1.0)
    split = view.split
    per_user_live, (in_flight, waiting, streaming) = agg.live_counts()
    counters: list[list[int]] = view.counters.tolist()
    conc_sum: list[float] = view.conc_sum.tolist()  # floats: the same IEEE divisions
    conc_max: list[float] = view.conc_max.tolist()
    samples = conc_sum[-1]

    def mean(i: int) -> float | None:
        return conc_sum[i] / samples if samples else None

    system = {
        **_rates(counters[0], span),
        "in_flight": in_flight,
        "waiting": waiting,
        "streaming": streaming,
        "ok": counters[0][C_OK],
        "input_tokens": counters[0][C_IN],
        "span_s": span,
        "in_flight_mean": mean(0),
        "in_flight_max": int(conc_max[0]) if samples else None,
        "waiting_mean": mean(1),
        "waiting_max": int(conc_max[1]) if samples else None,
        "streaming_mean": mean(2),
    }
    encoded = None
    if histograms:
        sys_table = split.extract([group_id(m, 0) for m in range(len(METRICS))])
        encoded = dict(zip(METRICS, encode_many(sys_table.keys, sys_table.counts,
                                                len(METRICS)), strict=True))

    user_ids = [sid for sid in agg.users.tracked()
                if counters[sid][C_REQ] or counters[sid][C_OUT] or sid in per_user_live]
    model_ids = [sid for sid in agg.models.tracked()
                 if counters[sid][C_REQ] or counters[sid][C_OUT]]
    latency, (p_ttft, p_itl, p_tpot, p_e2e) = _percentiles(split, user_ids + model_ids)
    # values at SYSTEM_PS: p50, p95 and p99 are [0], [2] and [3]
    users: list[dict[str, Any]] = []
    for i, sid in enumerate(user_ids):
        live = per_user_live.get(sid, [0, 0, 0])
        ttft, itl = p_ttft[i], p_itl[i]
        row: dict[str, Any] = {
            "user": agg.users.names[sid],
            "in_flight": live[0],
            "waiting": live[1],
            "streaming": live[2],
            **_rates(counters[sid], span),
            "ttft_p50": ttft[0],
            "ttft_p95": ttft[2],
            "ttft_p99": ttft[3],
            "itl_p50": itl[0],
            "itl_p95": itl[2],
            "itl_p99": itl[3],
            "tpot_p95": p_tpot[i][2],
            "e2e_p95": p_e2e[i][2],
            "tracked": sid != agg.users.other_id,
        }
        users.append(row)
    if user_histograms and user_ids:
        groups = [group_id(m, sid) for sid in user_ids for m in _ROW_METRICS]
        ut = split.extract(groups)
        texts = encode_many(ut.keys, ut.counts, len(groups))
        names = [METRICS[m] for m in _ROW_METRICS]
        for i, row in enumerate(users):
            k = i * len(names)
            row["histograms"] = dict(zip(names, texts[k:k + len(names)], strict=True))
    users.sort(key=lambda u: (-u["output_tps"], -u["requests"], u["user"]))

    models = [
        {
            "model": agg.models.names[sid],
            **_rates(counters[sid], span),
            "ttft_p95": p_ttft[i][2],
            "itl_p95": p_itl[i][2],
            "e2e_p95": p_e2e[i][2],
            "tracked": sid != agg.models.other_id,
        }
        for i, sid in enumerate(model_ids, start=len(user_ids))
    ]
    models.sort(key=lambda m: (-m["output_tps"], -m["requests"], m["model"]))

    warnings = [
        {"code": w.code, "severity": w.severity, "since": w.t, "message": w.message}
        for w in sorted(agg.warnings.values(), key=lambda w: (w.t, w.code))
    ]
    cap = agg.capacity.estimate(agg.slo.target, with_bins=capacity_bins)
    snap = {
        "version": VERSION,
        "time": now,
        "window_s": window_s,
        "system": system,
        "latency": latency,
        "users": users,
        "gpus": [gpu_row(agg.gpus[i], agg.host, now) for i in sorted(agg.gpus)],
        "gpu_status": agg.gpu_status() if agg.gpu_status is not None else None,
        "engine": engine_section(agg, window_s, now),
        "capacity": cap,
        "warnings": warnings,
        "histograms": encoded,
        "models": models,
        "series": list(agg.series),
        "slo": _slo_dict(agg.slo),
        "upstream": agg.upstream,
        "host": agg.host,
        "started_at": agg.started_at,
        "uptime_s": max(0.0, now - agg.started_at),
        "top_users": agg.users.capacity,
        "users_untracked": agg.users.untracked_recent(),
        "clamped_values": agg.clamped,
    }
    if encoded is None:
        del snap["histograms"]
    return snap

