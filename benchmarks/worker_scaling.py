"""Does a second worker double what llmtop forwards? Firehose wall throughput, 1 vs 2 workers,
each role on cores of its own.

Issue #11's target: with ``--workers 2``, firehose throughput ≥ 1.6× one worker's. Where the
load generator, the simulator and the proxy share a few cores (``scale_overhead.py``), wall
throughput measures the machine, so that benchmark compares CPU per chunk instead — a figure
that flatters the single process: saturated, it reads several chunks per read, while two
workers with spare time read fewer. This one measures what the target names, wall chunks/s,
with the proxy as the only limit:

* the proxy under test has its own cores: one for ``llmtop run --headless``, two for
  ``llmtop run --headless --workers 2`` (coordinator included: N workers, N cores); nginx
  (one worker) is pinned to one, as the reference;
* the upstream is ``--sims`` processes of ``llmtop sim --firehose --reuse-port`` sharing one
  port, a core each, so that it outpaces two workers;
* the load is ``--loaders`` generator processes (``proxy_overhead``'s bare protocol), a core
  each, ``--streams`` keep-alive streams in all, each sending the same streaming request
  back to back.

Cores are pinned with ``sched_setaffinity`` before ``exec`` (children and threads inherit
it). Each cell starts its proxy afresh, runs ``--warmup`` seconds of load uncounted and then
counts the content chunks the clients read in ``--duration`` seconds; the cells are
interleaved (the order rotates each round) and each configuration's figure is the median of
its rounds. ``direct`` (the simulators alone) shows the headroom: the comparison is fair
only when direct reaches at least 1.25× the two-worker figure (otherwise the simulators or
the generators were the limit) and every role had its own cores. The proxies' CPU use (% of
their cores) shows they were saturated.

Needs 2 + sims + loaders cores (9 by default); with fewer it runs unpinned and says that the
ratio is not a fair figure.

    python benchmarks/worker_scaling.py [--streams 256] [--duration 8] [--warmup 2]
        [--max-tokens 64] [--sims 4] [--loaders 3] [--rounds 2] [--no-nginx] [--no-pin]
        [--json OUT]

A cell whose proxy does not start, or that completes no request in its counted seconds
(every answer an HTTP error, connections refused, the proxy gone), measured nothing: it is
said on stderr with why (the proxy's exit code and last lines, the first error the load
generators saw), its row reads FAILED, the medians and the verdict leave it out, and the
run exits 3 once the rest has run (0: every cell carried requests; 2: bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_overhead as po

SIM_PREFIX = "llmtop: sim listening on "
PROXY_PREFIX = "llmtop: proxy listening on "
TARGET = 1.6
HEADROOM = 1.25
"""direct must reach this multiple of the 2-worker figure for the comparison to be fair"""

PIN = ("import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]);"
       " os.execvp(sys.argv[2], sys.argv[2:])")

LOADER = """
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[1])
import proxy_overhead as po

url, n, start, warm, dur, mt = sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:7]), \\
    int(sys.argv[7])

async def main() -> None:
    await asyncio.sleep(max(0.0, start - time.time()))
    phase = await po.run_load(url, n, warm + dur, mt, False)
    lo, hi = start + warm, start + warm + dur
    chunks = sum(1 for r in phase.results for t in r.times if lo <= t < hi)
    done = sum(1 for r in phase.results if r.times and lo <= r.times[-1] < hi)
    print(json.dumps({"chunks": chunks, "requests": done, "errors": phase.errors,
                      "first_error": phase.first_error}))

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


@dataclass
class Plan:
    """Which cores each role gets (empty lists: unpinned)."""

    proxy: list[int]
    sims: list[int]
    loaders: list[int]
    pinned: bool
    why: str = ""


@dataclass
class Cell:
    config: str
    round: int
    chunks_per_s: float
    requests: int
    errors: int
    cpu_s: float | None
    """the proxy's process tree, during the counted seconds (None: direct)"""
    cores: int
    duration: float
    failed: str | None = None
    """Why this cell measured nothing (its proxy did not start, or no request completed)."""

    @property
    def cpu_use(self) -> float | None:
        """CPU use as a share of the cores the proxy was given."""
        return None if self.cpu_s is None else self.cpu_s / self.duration / self.cores

    @property
    def cpu_us_per_chunk(self) -> float | None:
        total = self.chunks_per_s * self.duration
        return None if self.cpu_s is None or total <= 0 else self.cpu_s / total * 1e6


@dataclass
class Report:
    args: dict[str, Any]
    plan: Plan
    cells: list[Cell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def median(self, config: str) -> float | None:
        """The median of ``config``'s cells that measured something."""
        xs = [c.chunks_per_s for c in self.cells if c.config == config and c.failed is None]
        return statistics.median(xs) if xs else None

    @property
    def failures(self) -> list[str]:
        return [f"round {c.round + 1} {c.config}: {c.failed}" for c in self.cells
                if c.failed is not None]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"Exit status: 0 when every cell carried requests; "
                                f"{po.EXIT_FAILED} when a cell measured nothing (its proxy did "
                                "not start, or no request completed: its row reads FAILED and "
                                "stderr says why); 2 for bad arguments.")
    p.add_argument("--streams", type=int, default=256, help="concurrent streams (default 256)")
    p.add_argument("--duration", type=float, default=8.0,
                   help="counted seconds per cell (default 8)")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="uncounted seconds of load before them (default 2)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument("--sims", type=int, default=4,
                   help="simulator processes sharing the upstream port (default 4)")
    p.add_argument("--loaders", type=int, default=3,
                   help="load generator processes (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every cell (default 2)")
    p.add_argument("--no-nginx", action="store_true", help="skip the nginx reference")
    p.add_argument("--no-pin", action="store_true", help="do not pin roles to cores")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    for name in ("streams", "sims", "loaders", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.duration <= 0 or args.warmup < 0:
        p.error("--duration must be positive and --warmup not negative")
    if args.loaders > args.streams:
        p.error("--loaders cannot exceed --streams")
    return args


def plan_cores(sims: int, loaders: int, no_pin: bool,
               available: Sequence[int] | None = None) -> Plan:
    """Two cores for the proxy, one per simulator, one per load generator; unpinned (and
    said why) when there are not that many or ``no_pin``."""
    cores = sorted(os.sched_getaffinity(0)) if available is None else sorted(available)
    need = 2 + sims + loaders
    if no_pin:
        return Plan([], [], [], False, "--no-pin")
    if len(cores) < need:
        return Plan([], [], [], False, f"{len(cores)} cores, {need} needed "
                                       f"(2 proxy + {sims} sims + {loaders} loaders)")
    return Plan(cores[:2], cores[2:2 + sims], cores[2 + sims:need], True)


def pinned(cmd: list[str], cpus: Sequence[int]) -> list[str]:
    """``cmd`` run on ``cpus`` only (unchanged when there are none)."""
    if not cpus:
        return cmd
    return [sys.executable, "-c", PIN, ",".join(map(str, cpus)), *cmd]


def start_sims(plan: Plan, n: int) -> list[po.Proc]:
    procs: list[po.Proc] = []
    port = 0
    try:
        for i in range(n):
            cmd = [sys.executable, "-m", "llmtop", "sim", "--firehose", "--reuse-port",
                   "--listen", f"127.0.0.1:{port}", "--seed", str(i)]
            procs.append(po.Proc(pinned(cmd, plan.sims[i:i + 1]), SIM_PREFIX, timeout=60))
            port = int(procs[0].url.rsplit(":", 1)[1])
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: Sequence[po.Proc]) -> None:
    for p in reversed(procs):
        p.stop()
        if p.proc.stdout is not None:
            p.proc.stdout.close()


def start_proxy(config: str, upstream: str, plan: Plan, nginx_bin: str | None,
                tmp: Path) -> tuple[po.Proc, int]:
    """The proxy of ``config`` and how many cores it was given."""
    if config == "nginx":
        assert nginx_bin is not None
        proc = po.start_nginx(nginx_bin, upstream, tmp)
        for pid in proc.pids if plan.proxy else []:  # the master and its worker
            os.sched_setaffinity(pid, plan.proxy[:1])
        return proc, 1
    workers = 2 if config == "llmtop-2w" else 1
    cmd = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
           "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    return po.Proc(pinned(cmd, plan.proxy[:workers]), PROXY_PREFIX, timeout=60), workers


def measure(config: str, url: str, proxy: po.Proc | None, cores: int, rnd: int,
            args: argparse.Namespace, plan: Plan) -> Cell:
    """One cell: the loaders against ``url``; the proxy's CPU in the counted seconds."""
    bench_dir = str(Path(__file__).resolve().parent)
    start = time.time() + 2.0  # time for the loaders' interpreters to start
    share = [args.streams // args.loaders + (i < args.streams % args.loaders)
             for i in range(args.loaders)]
    loaders = [subprocess.Popen(
        pinned([sys.executable, "-c", LOADER, bench_dir, url, str(k), str(start),
                str(args.warmup), str(args.duration), str(args.max_tokens)],
               plan.loaders[i:i + 1]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, k in enumerate(share)]
    pids = proxy.pids if proxy is not None else []
    time.sleep(max(0.0, start + args.warmup - time.time()))
    c0 = po.cpu_s(pids)
    time.sleep(max(0.0, start + args.warmup + args.duration - time.time()))
    c1 = po.cpu_s(pids)
    chunks = requests = errors = 0
    first_error: str | None = None
    for p in loaders:
        out, err = p.communicate(timeout=args.warmup + args.duration + 120)
        if p.returncode != 0 or not out.strip():
            raise RuntimeError(f"a load generator failed ({config}): {err.strip()[-300:]}")
        got = json.loads(out.strip().splitlines()[-1])
        chunks += got["chunks"]
        requests += got["requests"]
        errors += got["errors"]
        first_error = first_error or got.get("first_error")
    cell = Cell(config, rnd, chunks / args.duration, requests, errors,
                None if proxy is None else c1 - c0, cores, args.duration)
    if requests == 0:
        seen = po.Result(config, args.streams, errors=errors, first_error=first_error)
        cell.failed = po.why_nothing(seen, proxy)
    return cell


def run(args: argparse.Namespace) -> Report:
    plan = plan_cores(args.sims, args.loaders, args.no_pin)
    report = Report(vars(args).copy(), plan)
    nginx_bin: str | None = None
    if not args.no_nginx:
        nginx_bin, why = po.ensure_nginx()
        if nginx_bin is None:
            report.notes.append(f"nginx not measured: {why}")
    configs = ["direct", "llmtop-1w", "llmtop-2w"] + (["nginx"] if nginx_bin else [])
    sims = start_sims(plan, args.sims)
    upstream = sims[0].url
    try:
        with tempfile.TemporaryDirectory(prefix="llmtop-scaling-") as tmp:
            for rnd in range(args.rounds):
                order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
                for config in order:
                    proxy: po.Proc | None = None
                    cores = 0
                    if config != "direct":
                        try:
                            proxy, cores = start_proxy(config, upstream, plan, nginx_bin,
                                                       Path(tmp))
                        except po.StartFailed as exc:
                            cell = Cell(config, rnd, 0.0, 0, 0, None, 0, args.duration,
                                        failed=str(exc))
                            report.cells.append(cell)
                            po.say_failed(f"round {rnd + 1}", config, str(exc),
                                          "worker_scaling")
                            continue
                    try:
                        cell = measure(config, proxy.url if proxy else upstream, proxy, cores,
                                       rnd, args, plan)
                    finally:
                        if proxy is not None:
                            stop_all([proxy])
                    report.cells.append(cell)
                    if cell.failed is not None:
                        po.say_failed(f"round {rnd + 1}", config, cell.failed,
                                      "worker_scaling")
                    print(f"  round {rnd + 1} {config:<10} {cell.chunks_per_s:>9,.0f} chunks/s"
                          + ("" if cell.cpu_use is None
                             else f"  CPU {100 * cell.cpu_use:.0f}% of {cores} core(s)"),
                          flush=True)
    finally:
        stop_all(sims)
    return report


def verdict(report: Report) -> list[str]:
    one, two, direct = (report.median(c) for c in ("llmtop-1w", "llmtop-2w", "direct"))
    if not one or not two or direct is None:
        return ["[firehose] FAILED 2 workers vs 1: a configuration measured nothing"]
    ratio = two / one
    headroom = direct / two
    why = []
    if not report.plan.pinned:
        why.append(f"unpinned: {report.plan.why}")
    if headroom < HEADROOM:
        why.append(f"direct is only {headroom:.2f}× the 2-worker figure (< {HEADROOM}×): "
                   "the simulators or load generators were the limit; add --sims/--loaders")
    state = "n/a (not a fair figure)" if why else ("PASS" if ratio >= TARGET else "MISS")
    lines = [f"[firehose] {state}  2 workers vs 1, wall throughput: {ratio:.2f}× "
             f"({two:,.0f} vs {one:,.0f} chunks/s; target ≥ {TARGET}×); direct "
             f"{direct:,.0f} chunks/s = {headroom:.2f}× the 2-worker figure"]
    lines += [f"    {w}" for w in why]
    return lines


def render(report: Report) -> str:
    plan = report.plan
    out = [f"worker scaling, firehose: {report.args['streams']} streams, "
           f"{report.args['max_tokens']} tokens per request, {report.args['duration']:g} s "
           f"counted per cell, {report.args['rounds']} round(s); "
           + (f"proxy cores {plan.proxy}, sims {plan.sims}, loaders {plan.loaders}"
              if plan.pinned else f"unpinned ({plan.why})"),
           "",
           "| configuration | chunks/s (median) | per round | proxy CPU % of its cores "
           "| CPU µs/chunk | requests | errors |",
           "|---|---|---|---|---|---|---|"]
    for config in dict.fromkeys(c.config for c in report.cells):
        cells = [c for c in report.cells if c.config == config]
        if all(c.failed is not None for c in cells):
            out.append(f"| {config} | FAILED: measured nothing (see below) | | | | | |")
            continue
        use = [c.cpu_use for c in cells if c.cpu_use is not None]
        per = [c.cpu_us_per_chunk for c in cells if c.cpu_us_per_chunk is not None]
        out.append(
            f"| {config} | {report.median(config) or 0:,.0f} | "
            + " / ".join("FAILED" if c.failed else f"{c.chunks_per_s:,.0f}" for c in cells)
            + " | "
            + (f"{100 * statistics.median(use):.0f}" if use else "") + " | "
            + (f"{statistics.median(per):.1f}" if per else "") + " | "
            + f"{sum(c.requests for c in cells)} | {sum(c.errors for c in cells)} |")
    out += ["", *verdict(report), *report.notes]
    out += [f"FAILED (no result): {f}".replace("|", "/") for f in report.failures]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"worker_scaling: {os.cpu_count()} CPUs; starting {args.sims} simulator(s) ...",
          flush=True)
    try:
        report = run(args)
    except po.StartFailed as exc:  # a simulator: nothing to measure
        po.say_failed("start", "the simulators", str(exc), "worker_scaling")
        return po.EXIT_FAILED
    text = render(report)
    print("\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": report.args, "plan": asdict(report.plan),
            "cells": [{**asdict(c), "cpu_use": c.cpu_use,
                       "cpu_us_per_chunk": c.cpu_us_per_chunk} for c in report.cells],
            "verdict": verdict(report), "notes": report.notes,
            "failed": report.failures}, indent=2))
    if report.failures:
        print(f"worker_scaling: FAILED: {len(report.failures)} cell(s) measured nothing; "
              f"their figures are no result (exit {po.EXIT_FAILED})", file=sys.stderr)
        return po.EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
