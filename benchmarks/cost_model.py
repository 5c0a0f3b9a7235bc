"""What a request costs the proxy, and what a chunk costs it, measured in place.

The same paced load (``llmtop sim``, one decode step every 20 ms) runs twice through each
proxy: answers of ``--long`` tokens, then of ``--short`` ones. The CPU of the forwarding
process (its schedstat run time) over each phase is then ``a × requests + b × chunks``,
two equations solved for ``a`` (µs per request: reading it, sending it upstream, the
answer's head, the end, the record) and ``b`` (µs per content chunk). A benchmark of the
per-request Python alone (``request_path.py``) runs warm and without sockets; this one has
the caches, the kernel and the scheduler of a proxy at work, which is where a wave of
requests (``proxy_overhead.py --spread``) costs what it costs.

Proxies: ``llmtop run --headless --split-observers`` (its forwarding process only: the
observers' process is left out, ``--one-process`` measures llmtop in one process, all of
it), a bare uvloop splice (the floor of any Python forwarder) and Debian's nginx (when
installed; ``proxy_overhead.py`` installs it). As ``proxy_overhead.py --pin``: the proxies
on the last CPU, the simulator and the load generator on the others; the phases alternate
between the proxies, ``--rounds`` times. Each figure has the machine's noise in it (±5%
between two processes of the same code here): compare proxies of one run, not runs.

    python benchmarks/cost_model.py [--streams 256] [--duration 6] [--long 32] [--short 8]
        [--rounds 2] [--one-process] [--no-nginx]

A proxy that does not start, or that completes no request in a phase (every answer an HTTP
error, connections refused, its process gone), measured nothing: stderr says which and why
(its exit code and last lines, the first error the load generator saw), its row reads
FAILED, and the run exits 3 once the others are measured (0: every proxy carried requests;
2: bad arguments or fewer than 2 CPUs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (
    EXIT_FAILED,
    PACED,
    SPLICE_PROXY,
    Proc,
    Result,
    StartFailed,
    cpu_s,
    ensure_nginx,
    observers_aside,
    run_load,
    run_on_uvloop,
    say_failed,
    start_nginx,
    warm_up,
    why_nothing,
)


@dataclass
class Phase:
    requests: int
    chunks: int
    cpu_s: float


@dataclass
class Target:
    name: str
    proc: Proc
    forwarding_only: bool
    """Leave the top process out (a split llmtop's observers)."""
    phases: dict[int, list[Phase]] = field(default_factory=dict)
    failed: str | None = None
    """Why it measured nothing (a phase in which no request completed)."""

    @property
    def pids(self) -> list[int]:
        pids = self.proc.pids
        return pids[1:] if self.forwarding_only and len(pids) > 1 else pids


def solve(long: Phase, short: Phase) -> tuple[float, float] | None:
    """(µs per request, µs per chunk) from two phases of different answer lengths; None when
    their requests and chunks are in the same proportion (no second equation)."""
    det = long.requests * short.chunks - short.requests * long.chunks
    if det == 0:
        return None
    a = (long.cpu_s * short.chunks - short.cpu_s * long.chunks) / det
    b = (long.requests * short.cpu_s - short.requests * long.cpu_s) / det
    return a * 1e6, b * 1e6


def pooled(phases: list[Phase]) -> Phase:
    return Phase(sum(p.requests for p in phases), sum(p.chunks for p in phases),
                 sum(p.cpu_s for p in phases))


async def measure(t: Target, n: int, duration: float, tokens: int) -> Phase:
    pids = t.pids
    cpu0 = cpu_s(pids)
    phase = await run_load(t.proc.url, n, duration, tokens, False)
    cpu1 = cpu_s(pids)
    if not phase.results and t.failed is None:
        seen = Result(t.name, n, errors=phase.errors, first_error=phase.first_error)
        t.failed = why_nothing(seen, t.proc)
        say_failed(f"{tokens} tokens", t.name, t.failed, "cost_model")
    return Phase(len(phase.results), sum(len(r.times) for r in phase.results), cpu1 - cpu0)


async def amain(args: argparse.Namespace) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("cost_model: needs 2 CPUs (the proxies on one, the load on the others)")
        return 2
    load_cpus, proxy_cpus = set(cpus[:-1]), {cpus[-1]}
    os.sched_setaffinity(0, load_cpus)
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1",
           "PYTHONSAFEPATH": "1"}
    with tempfile.TemporaryDirectory(prefix="llmtop-cost-") as tmp:
        try:
            return await _run(args, env, load_cpus, proxy_cpus, cpus[-1], tmp)
        except StartFailed as exc:  # the simulator: nothing to measure
            say_failed("start", "the simulator", str(exc), "cost_model")
            return EXIT_FAILED


async def _run(args: argparse.Namespace, env: dict[str, str], load_cpus: set[int],
               proxy_cpus: set[int], proxy_cpu: int, tmp: str) -> int:
    py = sys.executable
    procs: list[Proc] = []
    try:
        sim = Proc([py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1",
                    *PACED], "llmtop: sim listening on ", env, cpus=load_cpus)
        procs.append(sim)
        cmd = [py, "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
               "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
        split = not args.one_process
        targets: list[Target] = []
        not_started: list[str] = []

        def start(name: str, begin: Callable[[], Proc], forwarding_only: bool = False) -> None:
            """One proxy as a target; one that does not start is said and left out."""
            try:
                proc = begin()
            except StartFailed as exc:
                say_failed("start", name, str(exc), "cost_model")
                not_started.append(f"{name}: {exc}")
                return
            procs.append(proc)
            targets.append(Target(name, proc, forwarding_only))

        start("llmtop" + (" (forwarding process)" if split else ""), lambda: Proc(
            cmd + (["--split-observers"] if split else []), "llmtop: proxy listening on ",
            env, cpus=proxy_cpus), split)
        if targets:
            observers_aside(targets[0].proc, load_cpus)
        start("splice", lambda: Proc([py, "-c", SPLICE_PROXY, sim.url],
                                     "llmtop: proxy listening on ", env, cpus=proxy_cpus))
        nginx, why = (None, "--no-nginx") if args.no_nginx else ensure_nginx()
        if nginx:
            start("nginx", lambda: start_nginx(nginx, sim.url, Path(tmp), proxy_cpus))
        print(f"cost model: {args.streams} paced streams, answers of {args.long} and "
              f"{args.short} tokens, {args.duration:g} s phases, {args.rounds} rounds; "
              f"proxies on CPU {proxy_cpu}, load on {sorted(load_cpus)}"
              + ("" if nginx else f"; nginx not measured ({why})"),
              flush=True)
        for t in targets:
            await warm_up(t.proc.url, args.long)
            await run_load(t.proc.url, args.streams, 2.0, args.long, False)  # connections open
        for r in range(args.rounds):
            for tokens in (args.long, args.short):
                for t in targets if r % 2 == 0 else reversed(targets):
                    if t.failed is not None:
                        continue  # measured nothing already: no figure to pool
                    ph = await measure(t, args.streams, args.duration, tokens)
                    t.phases.setdefault(tokens, []).append(ph)
                    print(f"  round {r + 1}, {tokens} tokens, {t.name}: {ph.requests} "
                          f"requests, {ph.chunks} chunks, {ph.cpu_s:.3f} s CPU", flush=True)
        print(f"\n{'proxy':<30} {'µs/request':>10} {'µs/chunk':>9}  "
              f"(per chunk at {args.long} tokens, requests included)")
        for name in not_started:
            print(f"{name.partition(':')[0]:<30} FAILED: did not start")
        for t in targets:
            if t.failed is not None:
                print(f"{t.name:<30} FAILED: {t.failed}")
                continue
            long, short = pooled(t.phases[args.long]), pooled(t.phases[args.short])
            got = solve(long, short)
            whole = long.cpu_s / long.chunks * 1e6 if long.chunks else float("nan")
            if got is None:
                print(f"{t.name:<30} {'n/a':>10} {'n/a':>9}  ({whole:.1f})")
            else:
                print(f"{t.name:<30} {got[0]:>10.1f} {got[1]:>9.1f}  ({whole:.1f})")
        failures = not_started + [f"{t.name}: {t.failed}" for t in targets if t.failed]
        if failures:
            print(f"cost_model: FAILED: {len(failures)} proxy(ies) measured nothing; their "
                  f"rows are no result (exit {EXIT_FAILED})", file=sys.stderr)
            return EXIT_FAILED
        return 0
    finally:
        for p in reversed(procs):
            p.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"Exit status: 0 when every proxy carried requests; "
                                f"{EXIT_FAILED} when one measured nothing (did not start, or "
                                "no request completed in a phase: its row reads FAILED and "
                                "stderr says why); 2 for bad arguments or fewer than 2 CPUs.")
    p.add_argument("--streams", type=int, default=256, help="concurrent streams (256)")
    p.add_argument("--duration", type=float, default=6.0, help="seconds per phase (6)")
    p.add_argument("--long", type=int, default=32, help="tokens of the long answers (32)")
    p.add_argument("--short", type=int, default=8, help="tokens of the short answers (8)")
    p.add_argument("--rounds", type=int, default=2, help="alternations (2)")
    p.add_argument("--one-process", action="store_true",
                   help="llmtop in one process (observers included) instead of its "
                        "--split-observers forwarding process")
    p.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    args = p.parse_args()
    if args.long <= args.short or args.short < 1:
        p.error("--long must be more tokens than --short (>= 1)")
    if args.streams < 1 or args.duration <= 0 or args.rounds < 1:
        p.error("--streams, --duration and --rounds must be positive")
    return run_on_uvloop(amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
