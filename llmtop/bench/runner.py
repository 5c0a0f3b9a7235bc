"""Run a benchmark plan: levels (or a search), progress, table, verdict, JSON, recording."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import aiohttp

from llmtop import __version__
from llmtop.bench.client import Api, BenchClient
from llmtop.bench.loadgen import StepRun, run_closed, run_open
from llmtop.bench.search import SearchResult, passes, search
from llmtop.bench.summary import StepSummary, summarize
from llmtop.bench.workload import Workload
from llmtop.config import Config, slo_dict
from llmtop.events import RequestRecord


@dataclass
class BenchPlan:
    url: str
    mode: Literal["concurrency", "rate"]
    levels: list[float]
    search: bool
    duration_s: float | None
    requests: int | None
    warmup_s: float
    workload: Workload
    api: Api = "chat"
    model: str = "default"
    ignore_eos: bool = True
    poisson: bool = True
    seed: int = 0
    max_level: float = 1024
    timeout_s: float = 600.0
    admin_url: str | None = None
    record: str | None = None
    as_json: bool = False


class BenchStepLine:
    """A recording line (``type: bench_step``) with one level's summary."""

    def __init__(self, s: StepSummary) -> None:
        self.s = s

    def to_json_dict(self) -> dict[str, Any]:
        d = self.s.to_json_dict()
        d.pop("histograms", None)
        return {"type": "bench_step", "t": time.time(), **d}


class Progress:
    """One status line on stderr, rewritten in place on a terminal."""

    def __init__(self, out: TextIO = sys.stderr) -> None:
        self.out = out
        self.tty = out.isatty()
        self.label = ""
        self._last = 0.0

    def step(self, label: str) -> None:
        self.label = label
        self._write(f"{label}: starting", force=True)

    def update(self, run: StepRun) -> None:
        now = time.monotonic()
        if now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        ttfts = sorted(r.ttft_s for r in run.records[-200:] if r.ttft_s is not None)
        p95 = ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else None
        shown = "n/a" if p95 is None else f"{p95 * 1000:.0f} ms"
        self._write(f"{self.label}: {len(run.records)} requests done, TTFT p95 ≈ {shown}")

    def done(self, s: StepSummary) -> None:
        att = "n/a" if s.slo_attainment is None else f"{s.slo_attainment:.0%}"
        self._write(f"{self.label}: {s.requests} requests, {s.output_tps:.0f} tok/s, "
                    f"SLO attainment {att}", force=True, end=True)

    def _write(self, text: str, force: bool = False, end: bool = False) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + text + ("\n" if end else ""))
        elif force or end:
            self.out.write(text + "\n")
        else:
            self.out.write(text + "\n")
        self.out.flush()


async def _gpu_readings(session: aiohttp.ClientSession, admin: str) -> list[dict[str, Any]]:
    try:
        async with session.get(admin.rstrip("/") + "/llmtop/v1/snapshot?window=10") as r:
            snap = await r.json()
            gpus = snap.get("gpus") or []
            return [g for g in gpus if isinstance(g, dict)]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []


async def execute(plan: BenchPlan, cfg: Config, progress: Progress,
                  sink: list[RequestRecord], recorder: Any) -> SearchResult:
    client = BenchClient(plan.url, api=plan.api, model=plan.model, timeout_s=plan.timeout_s,
                         ignore_eos=plan.ignore_eos)
    integer = plan.mode == "concurrency"
    steps: list[StepSummary] = []
    gpu = None
    if not plan.admin_url:  # local GPUs through NVML, when there are any
        from llmtop.gpu import open_gpu_source

        gpu = open_gpu_source(cfg, lambda ev: None, upstream=plan.url)
        if gpu.start() and gpu.kind == "none":
            gpu = None

    async def run_level(level: float) -> StepSummary:
        shown = f"{int(level)}" if integer else f"{level:g}/s"
        progress.step(f"{plan.mode} {shown}")
        if integer:
            run = await run_closed(client, plan.workload, int(level), duration_s=plan.duration_s,
                                   requests=plan.requests, warmup_s=plan.warmup_s,
                                   progress=progress.update)
        else:
            run = await run_open(client, plan.workload, level, duration_s=plan.duration_s,
                                 requests=plan.requests, warmup_s=plan.warmup_s,
                                 poisson=plan.poisson, seed=plan.seed + len(steps),
                                 progress=progress.update)
        s = summarize(run, cfg)
        if plan.admin_url:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as sess:
                s.gpus = await _gpu_readings(sess, plan.admin_url)
        elif gpu is not None:
            s.gpus = [r.to_json_dict() for r in gpu.latest()]
        sink.extend(run.records)
        if recorder is not None:
            recorder.on_events(run.records)
            recorder.on_events([BenchStepLine(s)])
        steps.append(s)
        progress.done(s)
        return s

    try:
        if plan.search:
            return await search(run_level, integer=integer, start_levels=plan.levels,
                                target=cfg.slo.target, max_level=plan.max_level)
        for level in plan.levels:
            await run_level(level)
    finally:
        if gpu is not None:
            await gpu.stop()
    ok = [s for s in steps if passes(s, cfg.slo.target)]
    fail = [s for s in steps if not passes(s, cfg.slo.target)]
    best = max(ok, key=lambda s: s.level) if ok else None
    return SearchResult(steps, best, min(fail, key=lambda s: s.level) if fail else None)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f}"


def table(result: SearchResult, mode: str) -> list[str]:
    head = (f"{'':2}{mode:>11} {'reqs':>6} {'err':>4} {'rps':>7} {'tok/s':>8} {'goodput':>8} "
            f"{'SLO%':>5} {'TTFT p50':>9} {'p95':>6} {'p99':>6} {'ITL p50':>8} {'p95':>6} "
            f"{'TPOT p50':>9} {'E2E p95':>8}")
    lines = [head, "  " + "(latency in ms; goodput in tok/s)"]
    for s in result.ordered():
        mark = "▶ " if result.best is not None and s is result.best else "  "
        lvl = f"{int(s.level)}" if mode == "concurrency" else f"{s.level:g}/s"
        lat = s.latency
        att = "n/a" if s.slo_attainment is None else f"{s.slo_attainment * 100:.0f}"
        lines.append(
            f"{mark}{lvl:>11} {s.requests:>6} {s.errors + s.timeouts:>4} {s.rps:>7.2f} "
            f"{s.output_tps:>8.1f} {s.goodput_tps:>8.1f} {att:>5} "
            f"{_ms(lat['ttft'].get('p50')):>9} {_ms(lat['ttft'].get('p95')):>6} "
            f"{_ms(lat['ttft'].get('p99')):>6} {_ms(lat['itl'].get('p50')):>8} "
            f"{_ms(lat['itl'].get('p95')):>6} {_ms(lat['tpot'].get('p50')):>9} "
            f"{_ms(lat['e2e'].get('p95')):>8}"
        )
    return lines


def gpu_lines(result: SearchResult, mode: str) -> list[str]:
    """GPU memory and bandwidth at each level, when readings were in reach."""
    out: list[str] = []
    for s in result.ordered():
        for g in s.gpus:
            used, total = g.get("mem_used_bytes"), g.get("mem_total_bytes")
            mem = "n/a" if not used or not total else (
                f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB ({used / total:.0%})")
            bw = g.get("dram_bw_util")
            busy = g.get("mem_busy")
            lvl = f"{int(s.level)}" if mode == "concurrency" else f"{s.level:g}/s"
            sim = " (simulated)" if g.get("simulated") else ""
            out.append(
                f"  GPU {g.get('index')}{sim} at {lvl}: memory {mem}, DRAM bandwidth "
                f"{'n/a' if bw is None else f'{bw:.0f}%'}, memory busy "
                f"{'n/a' if busy is None else f'{busy:.0f}%'}"
            )
    return out


def slo_text(cfg: Config) -> str:
    parts = []
    s = cfg.slo
    if s.ttft_s is not None:
        parts.append(f"TTFT≤{s.ttft_s * 1000:.0f} ms")
    if s.itl_p95_s is not None:
        parts.append(f"ITL p95≤{s.itl_p95_s * 1000:.0f} ms")
    if s.tpot_s is not None:
        parts.append(f"TPOT≤{s.tpot_s * 1000:.0f} ms")
    if s.e2e_s is not None:
        parts.append(f"E2E≤{s.e2e_s:g} s")
    return ", ".join(parts) or "no SLOs"


def verdict(result: SearchResult, mode: str, cfg: Config) -> str:
    what = "concurrency" if mode == "concurrency" else "rate"
    head = f"max {what} meeting {slo_text(cfg)} at {cfg.slo.target:.0%}"
    if result.best is None:
        return f"{head}: none of the levels tried"
    b = result.best
    lvl = f"{int(b.level)}" if mode == "concurrency" else f"{b.level:g} req/s"
    tail = "" if result.first_fail is not None else " (no level failed: the limit is higher)"
    return f"{head}: {lvl} → {b.goodput_tps:,.0f} tok/s goodput{tail}"


def run_plan(plan: BenchPlan, cfg: Config, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    progress = Progress()
    records: list[RequestRecord] = []
    recorder = None
    if plan.record:
        from llmtop.recording.writer import Recorder

        recorder = Recorder(plan.record, header={
            "upstream": plan.url, "slo": slo_dict(cfg), "llmtop_version": __version__,
            "source": "bench", "bench": {
                "mode": plan.mode, "levels": plan.levels, "search": plan.search,
                "duration_s": plan.duration_s, "requests": plan.requests,
                "warmup_s": plan.warmup_s, "workload": plan.workload.describe(),
                "arrivals": "poisson" if plan.poisson else "constant", "api": plan.api,
            },
        })
        recorder.start()
    interrupted = False
    result: SearchResult | None = None
    try:
        result = asyncio.run(execute(plan, cfg, progress, records, recorder))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if recorder is not None:
            done = recorder.stop()
            print(f"llmtop bench: recorded {done.get('requests', 0)} requests to {plan.record}",
                  file=sys.stderr)
    if result is None:
        print(f"llmtop bench: interrupted after {len(records)} requests", file=sys.stderr)
        return 130
    if plan.as_json:
        json.dump({
            "mode": plan.mode, "slo": slo_dict(cfg), "workload": plan.workload.describe(),
            "steps": [s.to_json_dict() for s in result.ordered()],
            "best": None if result.best is None else result.best.level,
            "verdict": verdict(result, plan.mode, cfg),
        }, out, indent=2)
        out.write("\n")
    else:
        for line in table(result, plan.mode):
            print(line, file=out)
        for line in gpu_lines(result, plan.mode):
            print(line, file=out)
        print(verdict(result, plan.mode, cfg), file=out)
    return 130 if interrupted else 0
