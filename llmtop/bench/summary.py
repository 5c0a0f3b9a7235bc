"""Per-step figures, computed by the same aggregation code as live traffic.

Records of one step are fed to a fresh :class:`llmtop.metrics.aggregator.Aggregator` (the
live path's histograms and SLO logic) on a clock pinned to the step's end; rates are over
the step's measured duration. Input tokens are the engine's own prompt counts (usage), as
the proxy counts them: a request whose answer carried no usage — refused, rejected, broken
off before its usage — counts none.
Failures are counted by kind (``error_kinds``), and each configured SLO's own share of
met requests is kept (``slo_detail``) so a verdict can say which objective failed.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from llmtop.bench.client import error_kind
from llmtop.bench.loadgen import StepRun
from llmtop.config import Config
from llmtop.events import RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.slo import Slo, rank_of_percentile, request_itl_p95

LAT_KEYS = ("ttft", "itl", "chunk_gap", "tpot", "e2e")


@dataclass
class StepSummary:
    mode: str
    level: float
    duration_s: float
    requests: int
    ok: int
    errors: int
    timeouts: int
    cancelled: int
    rps: float
    output_tps: float
    input_tps: float
    goodput_rps: float
    goodput_tps: float
    slo_attainment: float | None
    per_request_tps_p50: float | None
    latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    token_sources: dict[str, int] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    overflow: int = 0
    warmup_requests: int = 0
    histograms: dict[str, str] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    """Failed requests (errors and timeouts) by kind, most frequent first."""
    slo_detail: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per configured objective: ``limit``, ``met`` (share of ok requests within it) and
    ``at_target`` (the value at the attainment target's percentile over ok requests)."""
    gave_up: bool = False
    """The level ended early because nothing succeeded."""
    no_output: int = 0
    """Successful requests (``ok``) whose answer carried no output at all (no content
    event: an empty 200, a web page — not an LLM endpoint)."""
    cut_off: int = 0
    """Requests still open at the level's end, left out (closed loop by duration: at the
    deadline)."""
    cut_off_answered: int = 0
    """Of ``cut_off``, those that had an answer's head by then."""
    send_lag_p99_s: float | None = None
    """Open loop: how late the load generator started its measured requests against
    their schedule, P99 (``None`` closed loop, or with no measured arrival)."""
    send_lag_max_s: float | None = None
    """Open loop: the same, the largest."""
    peak_open: int | None = None
    """Closed loop by ``--requests``: the most requests open at once as a measured one
    started (``None`` by duration, and in open loop). Below the level, the level was not
    measured (see :func:`llmtop.bench.search.unreached`)."""

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(run: StepRun, cfg: Config) -> StepSummary:
    now = [run.ended]
    agg = Aggregator(cfg, {}, clock=lambda: now[0], upstream="")
    agg.on_events(run.records)
    agg.tick(run.ended)
    snap = agg.snapshot(None)
    recs = run.records
    dur = run.duration_s
    system = snap.get("system", {})
    att = system.get("slo_attainment")
    out_tokens = sum(r.completion_tokens or 0 for r in recs)
    in_tokens = sum(r.prompt_tokens or 0 for r in recs)
    good_frac_rps = float(system.get("goodput_rps") or 0.0) / max(
        float(system.get("rps") or 0), 1e-12
    )
    good_frac_tps = float(system.get("goodput_tps") or 0.0) / max(
        float(system.get("output_tps") or 0), 1e-12
    )
    tps = [t for r in recs if (t := r.tps()) is not None]
    sources: dict[str, int] = {}
    for r in recs:
        sources[r.token_source] = sources.get(r.token_source, 0) + 1
    return StepSummary(
        mode=run.mode,
        level=run.level,
        duration_s=dur,
        requests=len(recs),
        ok=sum(1 for r in recs if r.outcome == "ok"),
        errors=sum(1 for r in recs if r.outcome == "error"),
        timeouts=sum(1 for r in recs if r.outcome == "timeout"),
        cancelled=sum(1 for r in recs if r.outcome == "cancelled"),
        rps=len(recs) / dur,
        output_tps=out_tokens / dur,
        input_tps=in_tokens / dur,
        goodput_rps=good_frac_rps * len(recs) / dur,
        goodput_tps=good_frac_tps * out_tokens / dur,
        slo_attainment=None if att is None else float(att),
        per_request_tps_p50=statistics.median(tps) if tps else None,
        latency={k: dict(snap.get("latency", {}).get(k, {})) for k in LAT_KEYS},
        token_sources=sources,
        overflow=run.overflow,
        warmup_requests=run.warmup_records,
        histograms=dict(snap.get("histograms", {})),
        error_kinds=count_errors(recs),
        slo_detail=slo_detail(recs, Slo.from_config(cfg)),
        gave_up=run.gave_up,
        no_output=sum(1 for r in recs if r.outcome == "ok" and r.ttft_s is None),
        cut_off=run.cut_off,
        cut_off_answered=run.cut_off_answered,
        send_lag_p99_s=_lag_p99(run.send_lags_ns),
        send_lag_max_s=max(run.send_lags_ns) / 1e9 if run.send_lags_ns else None,
        peak_open=run.peak_open,
    )


def _lag_p99(lags_ns: list[int]) -> float | None:
    if not lags_ns:
        return None
    return sorted(lags_ns)[rank_of_percentile(len(lags_ns), 99.0) - 1] / 1e9


def count_errors(recs: list[RequestRecord]) -> dict[str, int]:
    """Errors and timeouts by kind (``HTTP 500``, ``connection refused`` …), most first."""
    kinds: dict[str, int] = {}
    for r in recs:
        if r.outcome in ("error", "timeout"):
            k = error_kind(r)
            kinds[k] = kinds.get(k, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def errors_text(kinds: dict[str, int]) -> str:
    """``5 connection refused, 2 HTTP 500``."""
    return ", ".join(f"{n} {k}" for k, n in kinds.items())


def slo_detail(recs: list[RequestRecord], slo: Slo) -> dict[str, dict[str, float | None]]:
    """Each configured objective on its own, over the requests that completed."""
    ok = [r for r in recs if r.outcome == "ok"]
    # TTFT judges streamed answers only (a JSON body's "first token" is its whole time):
    # an answer it does not judge meets it, as in the attainment
    unjudged = sum(1 for r in ok if not r.stream)
    values: dict[str, tuple[float | None, list[float | None]]] = {
        "ttft": (slo.ttft_s, [r.ttft_s for r in ok if r.stream]),
        "itl_p95": (slo.itl_p95_s, [request_itl_p95(r) for r in ok]),
        "tpot": (slo.tpot_s, [r.tpot_s() for r in ok]),
        "e2e": (slo.e2e_s, [r.e2e_s for r in ok]),
    }
    out: dict[str, dict[str, float | None]] = {}
    for name, (limit, vals) in values.items():
        if limit is None:
            continue
        # the SLO rules: no first token fails TTFT; no ITL sample / no TPOT passes
        met = sum(1 for v in vals if (v is None and name != "ttft") or
                  (v is not None and v <= limit)) + (unjudged if name == "ttft" else 0)
        known = sorted(v for v in vals if v is not None)
        at = known[rank_of_percentile(len(known), slo.target * 100) - 1] if known else None
        out[name] = {"limit": limit, "met": met / len(ok) if ok else None, "at_target": at}
    return out
