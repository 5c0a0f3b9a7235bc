"""Per-step figures, computed by the same aggregation code as live traffic.

Records of one step are fed to a fresh :class:`llmtop.metrics.aggregator.Aggregator` (the
live path's histograms and SLO logic) on a clock pinned to the step's end; rates are over
the step's measured duration.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from llmtop.bench.loadgen import StepRun
from llmtop.config import Config
from llmtop.metrics.aggregator import Aggregator

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
    )
