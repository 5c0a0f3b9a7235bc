"""llmtop at scale: 1 and 2 workers beside direct and nginx, and the admin API polled at 10 Hz.

Builds on ``benchmarks/proxy_overhead.py`` (imported, not copied: the load generator, the
ground-truth comparison with ``llmtop sim``, nginx's setup and the /proc accounting are
its). For each mode (paced: one decode step every 20 ms; firehose: as fast as the simulator
can) it starts one simulator and, in front of it, nginx (one worker, ``proxy_buffering
off``), ``llmtop run --headless`` (one process) and ``llmtop run --headless --workers 2``
(a coordinator and two ``SO_REUSEPORT`` workers). Then for every stream count it runs the
same closed-loop load, interleaved (the order rotates from level to level; the proxies are
started afresh for every level and first run untimed at its concurrency, which gives the RSS
figures, as in ``proxy_overhead``), against:

* ``direct``      the simulator itself (the baseline every "added" figure subtracts);
* ``nginx``       the reference proxy: the targets are ratios to it in the same run;
* ``llmtop-1w``   one process;
* ``llmtop-2w``   coordinator + 2 workers (CPU and RSS are the whole process tree);
* ``llmtop-1w+poll`` a second one-process proxy like ``llmtop-1w`` (a process of its own,
  so that neither cell's requests change the other's CPU or memory) while a
  separate process ticks 10 times a second with the TUI's own ``AdminSource``: what
  ``llmtop attach --refresh-hz 10`` asks of one proxy (the TUI needs a terminal; its
  rendering runs in its own process and is not the proxy's cost). A tick asks
  ``/llmtop/v1/snapshot?window=60&histograms=0&active=1&max_age=0.5`` only when the answer
  it holds is older than 0.5 s (the proxy says how old in ``X-Llmtop-Age``): the snapshot a
  screen shows is at most 0.5 s old, and the proxy builds and sends about two a second
  however fast, and however many, screens tick (``histograms=0``: one proxy's TUI never
  decodes the encoded histograms, only a merge of several does). The GETs it made are
  printed beside the cell.

Accounting for the shared cores: the load generator (this process), the simulator and the
proxies share this machine's cores, so wall throughput with 2 workers says little about the
proxy — the generator and the simulator are as likely to be the bottleneck. The 1 vs 2
worker comparison is therefore made on CPU: each process's CPU per forwarded chunk gives
the throughput it would reach with a core of its own, and a configuration's capacity is
``min(cores / total CPU per chunk, 1 / busiest process's CPU per chunk)`` with cores = 1
for one process and 2 for two workers. The wall ratio is printed next to it.

    python benchmarks/scale_overhead.py [--streams 1,64,256,1024] [--duration 10]
        [--modes paced,firehose] [--max-tokens 64] [--rounds 1] [--no-nginx] [--quick]
        [--json OUT]

A configuration that does not start, or completes no request at a stream count (every
answer an HTTP error, connections refused, its process gone), measured nothing: its row
reads FAILED with why (as in ``proxy_overhead``), stderr says so, no target is judged on
it, and the run exits 3 once the rest has run (0: every cell carried requests; 2: bad
arguments).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_overhead as po

ADMIN_PREFIX = "llmtop: admin listening on "
PROXY_PREFIX = "llmtop: proxy listening on "
POLL_HZ = 10.0

POLLER = """
import asyncio, signal, sys, time
from llmtop.tui.source import SHARED_SNAPSHOT_AGE_S, AdminSource, SourceUnavailable

async def main() -> None:
    admin, hz = sys.argv[1], float(sys.argv[2])
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    # the TUI's own source, as `llmtop attach` makes it; each tick asks what the app's
    # refresh_now asks (the snapshot, then the active requests), without drawing
    source = AdminSource([admin], max_age_s=SHARED_SNAPSHOT_AGE_S)
    ticks = errors = 0
    print("poller ready", flush=True)
    nxt = time.monotonic()
    while not stop.is_set():
        try:
            await source.fetch(60)
            await source.active_requests()
            ticks += 1
        except SourceUnavailable:
            errors += 1
        nxt += 1.0 / hz
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, nxt - time.monotonic()))
        except TimeoutError:
            pass
    await source.close()
    print(f"poller polls {source.gets} ticks {ticks} errors {errors}", flush=True)

asyncio.run(main())
"""

CONFIGS = ("direct", "nginx", "llmtop-1w", "llmtop-2w", "llmtop-1w+poll")


@dataclass
class Cell:
    """One configuration at one stream count: proxy_overhead's Result plus the CPU split."""

    res: po.Result
    wall_s: float
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    polls: int | None = None
    ticks: int | None = None

    @property
    def capacity(self) -> float | None:
        """Chunks/s the proxy could forward with its own cores (see the module doc)."""
        chunks = self.res.chunks
        total = sum(self.cpu_by_pid.values())
        if not chunks or total <= 0:
            return None
        cores = min(len([c for c in self.cpu_by_pid.values() if c > 0.02 * total]), 2) or 1
        busiest = max(self.cpu_by_pid.values())
        return min(cores * chunks / total, chunks / busiest)

    def cpu_split(self) -> list[float]:
        """CPU µs per chunk of each process, the first started (coordinator) first."""
        if not self.res.chunks:
            return []
        return [round(c / self.res.chunks * 1e6, 1) for c in self.cpu_by_pid.values()]

    @property
    def busiest_util(self) -> float | None:
        if not self.cpu_by_pid or self.wall_s <= 0:
            return None
        return max(self.cpu_by_pid.values()) / self.wall_s


@dataclass
class ScaleReport:
    streams: list[int]
    duration_s: float
    max_tokens: int
    rounds: int = 1
    cells: dict[str, dict[int, dict[str, Cell]]] = field(default_factory=dict)
    """mode -> streams -> configuration -> figures"""
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """One line per configuration that measured nothing at a stream count: why."""


def _cpu_each(pids: Sequence[int]) -> dict[int, float]:
    return {p: po.cpu_s([p]) for p in pids}


def _stop_all(procs: Sequence[po.Proc]) -> None:
    """Stop the processes (last started first) and close their output pipes once the
    threads draining them have read to the end."""
    for p in reversed(procs):
        p.stop()
    for t in threading.enumerate():
        if t.name.endswith("(_drain)"):
            t.join(5)
    for p in procs:
        if p.proc.stdout is not None:
            p.proc.stdout.close()


def _start_poller(admin: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A separate process ticking at POLL_HZ with the TUI's ``AdminSource``, as ``llmtop
    attach`` does (a tick asks a proxy only when its last answer is older than the
    TUI's ``max_age``)."""
    proc = subprocess.Popen([sys.executable, "-c", POLLER, admin, str(POLL_HZ)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("poller ready"):
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the admin poller did not start: {line.strip()}")
    return proc


def _stop_poller(proc: subprocess.Popen[str]) -> tuple[int | None, int | None]:
    """Stop the poller: the admin GETs it made and its screen ticks (None if it did not
    say)."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    for line in out.splitlines():
        if line.startswith("poller polls "):
            f = line.split()
            return int(f[2]), int(f[4])
    return None, None


def _start_llmtop(upstream: str, workers: int, env: dict[str, str]) -> tuple[po.Proc, str]:
    cmd = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
           "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc = po.Proc(cmd, PROXY_PREFIX, env, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in list(proc.lines):
            if line.startswith(ADMIN_PREFIX):
                return proc, line[len(ADMIN_PREFIX):].strip()
        time.sleep(0.05)
    proc.stop()
    raise po.StartFailed(f"llmtop ({workers} workers) printed no admin address: "
                         f"{proc.last_words()}")


async def _measure(name: str, url: str, proc: po.Proc | None, sim_url: str,
                   n: int, args: argparse.Namespace, session: aiohttp.ClientSession) -> Cell:
    pids = proc.pids if proc is not None else []
    before = _cpu_each(pids)
    t0 = time.monotonic()
    res = await po.measure(name, url, pids, sim_url, n, args.duration, args.max_tokens,
                           False, session)
    wall = time.monotonic() - t0
    after = _cpu_each(pids)
    return Cell(res, wall, {p: after[p] - before.get(p, after[p]) for p in after})


def _merge_cells(a: Cell, b: Cell) -> Cell:
    """Two rounds of one cell as one (``--rounds``): see ``proxy_overhead.merge_rounds``;
    CPU, wall time, ticks and GETs summed."""
    cpu = dict(a.cpu_by_pid)
    for pid, c in b.cpu_by_pid.items():
        cpu[pid] = cpu.get(pid, 0.0) + c

    def add(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else x + y

    return Cell(po.merge_rounds(a.res, b.res), a.wall_s + b.wall_s, cpu,
                add(a.polls, b.polls), add(a.ticks, b.ticks))


async def run_mode(mode: str, args: argparse.Namespace, nginx_bin: str | None,
                   env: dict[str, str], tmp: Path, report: ScaleReport) -> None:
    py = sys.executable
    sim_cmd = [py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1"]
    sim_cmd += ["--firehose"] if mode == "firehose" else po.PACED
    procs: list[po.Proc] = []
    proxies: list[po.Proc] = []
    try:
        sim = po.Proc(sim_cmd, "llmtop: sim listening on ", env)
        procs.append(sim)
        admin = ""
        not_started: dict[str, str] = {}
        """The configurations of this level that did not start, and why."""

        def start(name: str, targets: dict[str, tuple[str, po.Proc | None]],
                  begin: Callable[[], tuple[po.Proc, str]]) -> str:
            """Start one proxy as configuration ``name`` (its admin URL back, or ""); one
            that does not start is left out of this level and said at its end."""
            try:
                proc, its_admin = begin()
            except po.StartFailed as exc:
                not_started[name] = str(exc)
                return ""
            proxies.append(proc)
            targets[name] = (proc.url, proc)
            return its_admin

        async def start_proxies() -> dict[str, tuple[str, po.Proc | None]]:
            """Fresh proxies for each level, warmed up (as ``proxy_overhead`` does: RSS per
            stream is then what this level's streams add, not history earlier phases
            left, nor memory they freed that this phase reuses unseen)."""
            nonlocal admin
            for p in proxies:
                p.stop()
            proxies.clear()
            not_started.clear()
            targets: dict[str, tuple[str, po.Proc | None]] = {"direct": (sim.url, None)}
            if nginx_bin:
                start("nginx", targets,
                      lambda: (po.start_nginx(nginx_bin, sim.url, tmp), ""))
            for w in args.workers:
                start(f"llmtop-{w}w", targets, partial(_start_llmtop, sim.url, w, env))
            if args.poll:
                # a process of its own, configured as llmtop-1w, so that neither cell's
                # requests change the other's CPU or memory
                admin = start("llmtop-1w+poll", targets, lambda: _start_llmtop(sim.url, 1, env))
            for url, _ in targets.values():
                await po.warm_up(url, args.max_tokens)
            return targets

        order = ["direct"] + (["nginx"] if nginx_bin else []) + [
            f"llmtop-{w}w" for w in args.workers] + (["llmtop-1w+poll"] if args.poll else [])
        by_level: dict[int, dict[str, Cell]] = {}
        report.cells[mode] = by_level
        async with aiohttp.ClientSession() as session:
            for li, n in enumerate(args.streams):
                targets = await start_proxies()
                cold = await po.settle(targets, sim.url, n, args.duration, args.max_tokens,
                                       False, session)
                by: dict[str, Cell] = {}
                rot = order[li % len(order):] + order[: li % len(order)]
                for name in [x for _ in range(args.rounds) for x in rot]:
                    if name not in targets:
                        continue  # it did not start
                    poller: subprocess.Popen[str] | None = None
                    if name == "llmtop-1w+poll":
                        poller = _start_poller(admin, env)
                    url, proc = targets[name]
                    try:
                        cell = await _measure(name, url, proc, sim.url, n,
                                              args, session)
                    finally:
                        if poller is not None:
                            polls, ticks = await asyncio.to_thread(_stop_poller, poller)
                    if poller is not None:
                        cell.polls, cell.ticks = polls, ticks
                    prev = by.get(name)
                    by[name] = cell if prev is None else _merge_cells(prev, cell)
                    r = cell.res
                    print(f"  {mode} n={n} {name}: {r.requests} requests, "
                          f"{r.chunks_per_s:.0f} chunks/s"
                          + (f", {cell.ticks} screen ticks, {cell.polls} admin GETs"
                             if cell.polls is not None else "")
                          + (f", errors {r.errors}" if r.errors else "")
                          + (f", unmatched {r.unmatched}" if r.unmatched else ""), flush=True)
                    await asyncio.sleep(0.3)
                for name, cell in by.items():
                    if name in cold:
                        cell.res = po.with_rss_of(cell.res, cold[name])
                for name in order:
                    why = (not_started[name] if name in not_started
                           else po.why_nothing(by[name].res, targets[name][1])
                           if by[name].res.requests == 0 else None)
                    if why is not None:
                        if name in by:
                            by[name].res = replace(by[name].res, failed=why)
                        else:
                            by[name] = Cell(po.Result(name, n, failed=why), 0.0)
                        po.say_failed(f"[{mode}] {n} streams", name, why, "scale_overhead")
                        report.failures.append(f"[{mode}] {n} streams: {name}: {why}")
                by_level[n] = by
    finally:
        _stop_all([*proxies, *procs])


# -- the tables ------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def _added(cell: Cell | None, base: Cell | None, attr: str, q: float) -> float | None:
    if cell is None or base is None:
        return None
    return po.added(cell.res, base.res, attr, q)


def figures_table(report: ScaleReport) -> str:
    head = ("| mode | streams | via | reqs | chunks/s | +TTFT p50 ms | +TTFT p99 ms "
            "| +chunk p50 ms | +chunk p99 ms | coalesced | CPU µs/chunk | RSS KiB/stream "
            "| capacity chunks/s | CPU µs/chunk by process |")
    out = [head, "|" + "---|" * 14]
    for mode, levels in report.cells.items():
        for n, by in levels.items():
            base = by.get("direct")
            for name in CONFIGS:
                c = by.get(name)
                if c is None:
                    continue
                r = c.res
                if r.failed is not None:  # (a "|" of its last lines would make a column)
                    out.append(f"| {mode} | {n} | {name} FAILED: "
                               f"{r.failed.replace('|', '/')} |" + " |" * 11)
                    continue
                if name == "direct":
                    vals = ["", "", "", ""]
                else:
                    vals = [_ms(_added(c, base, "ttft_over", 50)),
                            _ms(_added(c, base, "ttft_over", 99)),
                            _ms(_added(c, base, "chunk_delay", 50)),
                            _ms(_added(c, base, "chunk_delay", 99))]
                cpu = "" if r.cpu_us_per_chunk is None else f"{r.cpu_us_per_chunk:.1f}"
                rss = "" if r.rss_kib_per_stream is None else f"{r.rss_kib_per_stream:.1f}"
                cap = "" if c.capacity is None else f"{c.capacity:.0f}"
                flags = (f" ({r.errors} errors)" if r.errors else "") + (
                    f" ({r.unmatched} unmatched)" if r.unmatched else "")
                out.append(f"| {mode} | {n} | {name}{flags} | {r.requests} | "
                           f"{r.chunks_per_s:.0f} | " + " | ".join(vals)
                           + f" | {r.coalesced} | {cpu} | {rss} | {cap} | "
                           + (" + ".join(f"{x:g}" for x in c.cpu_split())
                              if len(c.cpu_by_pid) > 1 else "") + " |")
    return "\n".join(out)


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def targets_table(report: ScaleReport) -> str:
    """The issue's targets, as ratios to nginx (and to one worker / no polling)."""
    rows = ["| mode | streams | config | target | figure | reference | result |",
            "|---|---|---|---|---|---|---|"]

    def row(mode: str, n: int, cfg: str, target: str, fig: str, ref: str,
            ok: bool | None) -> None:
        rows.append(f"| {mode} | {n} | {cfg} | {target} | {fig} | {ref} | {_mark(ok)} |")

    for mode, levels in report.cells.items():
        for n, level in levels.items():
            by = {name: c for name, c in level.items() if c.res.failed is None}
            d, ng = by.get("direct"), by.get("nginx")
            for cfg in ("llmtop-1w", "llmtop-2w"):
                c = by.get(cfg)
                if c is None or d is None:
                    continue
                for attr, label in (("ttft_over", "added TTFT p99"),
                                    ("chunk_delay", "added chunk p99")):
                    a, ref = _added(c, d, attr, 99), _added(ng, d, attr, 99)
                    if a is None or ref is None:
                        continue
                    if n == 1:
                        row(mode, n, cfg, f"{label} ≤ nginx + 0.5 ms", _ms(a), _ms(ref),
                            a <= ref + 5e-4)
                    else:  # a ratio to nginx at or below zero (within noise) says nothing
                        row(mode, n, cfg, f"{label} ≤ 1.5× nginx", _ms(a), _ms(ref),
                            a <= 1.5 * ref if ref > 0 else None)
                cc, nc = c.res.cpu_us_per_chunk, ng.res.cpu_us_per_chunk if ng else None
                if cc is not None and nc is not None:
                    row(mode, n, cfg, "CPU/chunk ≤ 2× nginx", f"{cc:.1f} µs", f"{nc:.1f} µs",
                        cc <= 2 * nc)
                row(mode, n, cfg, "zero coalesced (beyond direct)", str(c.res.coalesced),
                    f"direct {d.res.coalesced}", c.res.coalesced <= d.res.coalesced)
                if n > 1 and c.res.rss_kib_per_stream is not None:
                    row(mode, n, cfg, "RSS ≤ 64 KiB/stream",
                        f"{c.res.rss_kib_per_stream:.1f} KiB", "64 KiB",
                        c.res.rss_kib_per_stream <= 64)
            one, two = by.get("llmtop-1w"), by.get("llmtop-2w")
            if mode == "firehose" and one and two and one.capacity and two.capacity:
                wall = (two.res.chunks_per_s / one.res.chunks_per_s
                        if one.res.chunks_per_s else float("nan"))
                ratio = two.capacity / one.capacity
                util = one.busiest_util
                row(mode, n, "2w vs 1w", "throughput ≥ 1.6× one worker (CPU-based capacity)",
                    f"{ratio:.2f}× ({two.capacity:.0f} vs {one.capacity:.0f} chunks/s)",
                    f"wall {wall:.2f}× ({two.res.chunks_per_s:.0f} vs "
                    f"{one.res.chunks_per_s:.0f}); 1w busiest process "
                    + ("n/a" if util is None else f"{util * 100:.0f}% of a core"),
                    ratio >= 1.6)
            p, q = by.get("llmtop-1w+poll"), by.get("llmtop-1w")
            if p and q and d:
                a, b = _added(p, d, "chunk_delay", 99), _added(q, d, "chunk_delay", 99)
                if a is not None and b is not None:
                    row(mode, n, "1w polled 10 Hz", "Δ added chunk p99 ≤ 0.1 ms",
                        f"{(a - b) * 1e3:+.2f} ms", f"{_ms(a)} vs {_ms(b)} ms"
                        + (f"; {p.ticks} ticks, {p.polls} GETs" if p.polls is not None
                           else ""),
                        abs(a - b) <= 1e-4)
                pc, qc = p.res.cpu_us_per_chunk, q.res.cpu_us_per_chunk
                if pc is not None and qc:
                    row(mode, n, "1w polled 10 Hz", "Δ CPU/chunk ≤ 5%",
                        f"{(pc / qc - 1) * 100:+.1f}%", f"{pc:.1f} vs {qc:.1f} µs",
                        abs(pc / qc - 1) <= 0.05)
    return "\n".join(rows)


# -- main -------------------------------------------------------------------------------------


async def run_scale(args: argparse.Namespace) -> ScaleReport:
    """Run every mode and stream count; ``args`` as parsed by :func:`parse_args`."""
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1"}
    report = ScaleReport(list(args.streams), args.duration, args.max_tokens, args.rounds)
    nginx_bin, why = (None, "--no-nginx") if args.no_nginx else po.ensure_nginx()
    if nginx_bin is None:
        report.notes.append(f"nginx not measured ({why})")
    with tempfile.TemporaryDirectory(prefix="llmtop-scale-") as tmpdir:
        for mode in args.modes:
            (Path(tmpdir) / mode).mkdir()
            try:
                await run_mode(mode, args, nginx_bin, env, Path(tmpdir) / mode, report)
            except po.StartFailed as exc:  # the simulator: nothing of this mode to measure
                po.say_failed(f"[{mode}]", "the simulator", str(exc), "scale_overhead")
                report.failures.append(f"[{mode}] the simulator: {exc}")
    return report


def render(report: ScaleReport) -> str:
    return "\n\n".join([
        f"streams {report.streams}, {report.duration_s:g} s per cell"
        + (f" x {report.rounds} rounds (pooled)" if report.rounds > 1 else "") + ", "
        f"{report.max_tokens} tokens per request"
        + "".join(f"; {n}" for n in report.notes),
        figures_table(report), targets_table(report)])


def to_json(report: ScaleReport) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": report.streams, "duration_s": report.duration_s,
                           "rounds": report.rounds, "max_tokens": report.max_tokens,
                           "notes": report.notes, "failed": report.failures}
    for mode, levels in report.cells.items():
        out[mode] = {str(n): {name: {
            "requests": c.res.requests, "errors": c.res.errors, "chunks": c.res.chunks,
            "unmatched": c.res.unmatched, "coalesced": c.res.coalesced,
            "chunks_per_s": c.res.chunks_per_s, "capacity_chunks_per_s": c.capacity,
            "ttft_overhead_p50_s": po.pct(c.res.ttft_over, 50),
            "ttft_overhead_p99_s": po.pct(c.res.ttft_over, 99),
            "chunk_delay_p50_s": po.pct(c.res.chunk_delay, 50),
            "chunk_delay_p99_s": po.pct(c.res.chunk_delay, 99),
            "cpu_us_per_chunk": c.res.cpu_us_per_chunk,
            "rss_kib_per_stream": c.res.rss_kib_per_stream, "admin_gets": c.polls,
            "screen_ticks": c.ticks,
            "cpu_us_per_chunk_by_process": c.cpu_split(),
            "busiest_process_core_share": c.busiest_util,
            "failed": c.res.failed,
        } for name, c in by.items()} for n, by in levels.items()}
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"Exit status: 0 when every cell carried requests; "
                                f"{po.EXIT_FAILED} when a configuration measured nothing at a "
                                "stream count (did not start, or answered no request: its row "
                                "reads FAILED and stderr says why); 2 for bad arguments.")
    p.add_argument("--streams", default="1,64,256,1024",
                   help="concurrent streams, comma-separated (default 1,64,256,1024)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per cell (default 10)")
    p.add_argument("--modes", default="paced,firehose", help="paced,firehose (default both)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="tokens per request (default 64; the simulator keeps the ground "
                        "truth of its last 10,000 requests)")
    p.add_argument("--workers", default="1,2", help="llmtop worker counts (default 1,2)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each level's rotation this many times, pooled (default 1): "
                        "one 10 s cell's p99 and CPU vary by more than the 5%% and 0.1 ms "
                        "the poll targets ask")
    p.add_argument("--no-poll", dest="poll", action="store_false",
                   help="skip the admin-polled-at-10-Hz cell")
    p.add_argument("--no-nginx", action="store_true", help="skip the nginx comparison")
    p.add_argument("--quick", action="store_true",
                   help="streams 1,64 and 3 s per cell (unless given)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.quick:
        if "--streams" not in (argv if argv is not None else sys.argv):
            args.streams = "1,64"
        if "--duration" not in (argv if argv is not None else sys.argv):
            args.duration = 3.0
    try:
        args.streams = [int(x) for x in args.streams.split(",") if x]
        args.workers = [int(x) for x in args.workers.split(",") if x]
    except ValueError:
        p.error("--streams and --workers must be comma-separated integers")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not args.streams or min(args.streams) < 1 or not args.workers \
            or min(args.workers) < 1:
        p.error("--streams and --workers must be positive")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or not set(args.modes) <= {"paced", "firehose"}:
        p.error("--modes: paced and/or firehose")
    if args.duration <= 0:
        p.error("--duration must be positive")
    return args


async def amain(args: argparse.Namespace) -> int:
    print(f"llmtop scale overhead: streams {args.streams}, {args.duration:g} s per cell"
          + (f" x {args.rounds} rounds" if args.rounds > 1 else "") + ", "
          f"modes {args.modes}, workers {args.workers}, admin poll "
          f"{'on' if args.poll else 'off'}; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    report = await run_scale(args)
    print("\n" + render(report), flush=True)
    if args.json:
        await asyncio.to_thread(Path(args.json).write_text,
                                json.dumps(to_json(report), indent=2))
    if report.failures:
        print(f"scale_overhead: FAILED: {len(report.failures)} cell(s) measured nothing; "
              f"their rows are no result (exit {po.EXIT_FAILED}):", file=sys.stderr)
        for line in report.failures:
            print("  " + line, file=sys.stderr)
        return po.EXIT_FAILED
    return 0


def main() -> int:
    args = parse_args()
    return po.run_on_uvloop(amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
