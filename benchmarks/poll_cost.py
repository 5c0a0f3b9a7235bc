"""What a TUI attached at 10 Hz costs one proxy, measured in place: the same proxy and the
same load, the poller paused and running in alternate phases.

``scale_overhead.py``'s polled cell compares two proxy processes side by side, and two
processes' CPU per chunk differ by more than the 5% the target allows (±5-20% between
runs). Here one ``llmtop run --headless`` serves a closed-loop load of paced streams
(``llmtop sim``, one decode step every 20 ms) for the whole run while the poller of
``scale_overhead.py`` — the TUI's own ``AdminSource`` ticking at 10 Hz, which asks for a
snapshot whenever the one it holds is older than 0.5 s — is resumed (SIGCONT) and paused
(SIGSTOP) phase by phase, the order alternating from round to round. Each phase's CPU is
every thread's run time from ``/proc/<pid>/task/*/schedstat`` (the forwarding thread, and
the rest: the observers' thread that answers the admin API); its chunks are those the
load generator received in it. Each phase also gives the delay of every content chunk the
client read in it (client read time − the simulator's write time, from its ground truth
``/sim/requests``, read after each phase): the medians of the phases' p99s, polled minus
quiet, are the poller's Δ chunk-delay p99 (the issue's ≤ 0.1 ms target), measured on the
same proxy rather than between two.

    python benchmarks/poll_cost.py [--streams 64] [--phase 8] [--rounds 4] [--hz 10]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_overhead as po
import scale_overhead as so


def thread_ns(pid: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:
            pass
    return out


Phases = list[tuple[bool, float, float, dict[int, int], dict[int, int], list[float]]]
"""Per phase: polled, its start and end (time.time), every thread's run time (ns) at both,
and the delay of each content chunk the client read in it (client read − engine write, s)."""

FINISH_S = 1.5
"""After a phase, how long the requests still open at its end get to finish before the
engine's ground truth is read (their chunks within the phase count too): ~2× a 32-token
answer at one step every 20 ms."""
RECOVER_S = 0.5
"""After reading the ground truth, how long the next phase waits (the simulator encodes up
to 10,000 requests' chunk times for that read, and its steps run late meanwhile)."""


async def chunk_delays(session: aiohttp.ClientSession, sim_url: str, load: po.Phase,
                       t0: float, t1: float) -> list[float]:
    """Client read time − engine write time of every content chunk read in [t0, t1), from
    the simulator's ground truth (its last 10,000 requests: enough for one phase of 1,024
    streams) and the load generator's finished requests."""
    async with session.get(sim_url + "/sim/requests") as r:
        truth = {t["id"]: t["chunks"] for t in await r.json()}
    out: list[float] = []
    for req in load.results:
        wrote = truth.get(req.rid or "")
        if wrote is None or len(wrote) != len(req.times) or not req.times:
            continue
        if req.times[-1] < t0 or req.times[0] >= t1:
            continue
        out.extend(c - w for c, w in zip(req.times, wrote, strict=True) if t0 <= c < t1)
    return out


async def run_phases(url: str, sim_url: str, pid: int, poller: int, args: argparse.Namespace
                     ) -> tuple[Phases, po.Phase]:
    """The load for the whole run; the poller resumed and paused phase by phase."""
    await po.warm_up(url, args.max_tokens)
    total = 2 * args.rounds * (args.phase + FINISH_S + RECOVER_S + 0.3) + 4.0
    started: list[po.Phase] = []
    load = asyncio.ensure_future(po.run_load(url, args.streams, total, args.max_tokens, False,
                                             started=started))
    await asyncio.sleep(2.0)  # the streams open and settle
    phases: Phases = []
    async with aiohttp.ClientSession() as session:
        for r in range(args.rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                os.kill(poller, signal.SIGCONT if on else signal.SIGSTOP)
                await asyncio.sleep(0.3)  # the state takes hold
                a, t0 = thread_ns(pid), time.time()
                await asyncio.sleep(args.phase)
                b, t1 = thread_ns(pid), time.time()
                await asyncio.sleep(FINISH_S)  # (the poller as in the phase)
                delays = await chunk_delays(session, sim_url, started[0], t0, t1)
                phases.append((on, t0, t1, a, b, delays))
                await asyncio.sleep(RECOVER_S)
    os.kill(poller, signal.SIGCONT)
    return phases, await load


def failed(why: str) -> int:
    """The run measured nothing: one line on stderr, and the benchmarks' "measured nothing"
    exit status."""
    print(f"poll_cost: FAILED: {why}", file=sys.stderr)
    return po.EXIT_FAILED


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=f"Exit status: 0 with figures; {po.EXIT_FAILED} when it measured nothing (the "
               "simulator or the proxy did not start, or no chunk came through).")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--phase", type=float, default=8.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=4, help="off/on pairs")
    ap.add_argument("--hz", type=float, default=so.POLL_HZ)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    for name, value, low in (("--streams", args.streams, 1), ("--rounds", args.rounds, 1),
                             ("--max-tokens", args.max_tokens, 1)):
        if value < low:
            ap.error(f"{name} must be at least {low}")
    if not (args.phase > 0 and args.hz > 0):
        ap.error("--phase and --hz must be positive")
    py, env = sys.executable, dict(os.environ)
    try:
        sim = po.Proc([py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1",
                       *po.PACED], "llmtop: sim listening on ", env)
    except po.StartFailed as exc:
        return failed(str(exc))
    try:
        llm, admin = so._start_llmtop(sim.url, 1, env)
    except po.StartFailed as exc:
        sim.stop()
        return failed(str(exc))
    poller = subprocess.Popen([py, "-c", so.POLLER, admin, str(args.hz)],
                              stdout=subprocess.PIPE, text=True, env=env)
    with_polls = ""
    try:
        assert poller.stdout is not None and "ready" in poller.stdout.readline()
        os.kill(poller.pid, signal.SIGSTOP)
        phases, phase = asyncio.run(run_phases(llm.url, sim.url, llm.proc.pid, poller.pid,
                                               args))
    finally:
        if poller.poll() is None:
            os.kill(poller.pid, signal.SIGCONT)
            poller.send_signal(signal.SIGINT)
            with_polls = (poller.communicate(timeout=10)[0] or "").strip()
        llm.stop()
        sim.stop()
    times = sorted(t for req in phase.results for t in req.times)
    rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    p99s: dict[bool, list[float]] = {False: [], True: []}
    pid = llm.proc.pid
    print(f"{args.streams} paced streams, {args.max_tokens} tokens a request, phases of "
          f"{args.phase:g} s; poller at {args.hz:g} Hz (asks when its snapshot is > 0.5 s old)")
    for on, t0, t1, a, b, delays in phases:
        chunks = bisect.bisect_left(times, t1) - bisect.bisect_left(times, t0)
        main_ns = b.get(pid, 0) - a.get(pid, 0)
        rest_ns = sum(b[t] - a.get(t, 0) for t in b if t != pid)
        p99 = po.pct(delays, 99)
        if p99 is not None:
            p99s[on].append(p99)
        if chunks:
            rows[on].append((main_ns / chunks / 1e3, rest_ns / chunks / 1e3,
                             chunks / (t1 - t0)))
            print(f"  {'polled' if on else 'quiet '}  chunks/s {chunks / (t1 - t0):7.0f}  "
                  f"CPU µs/chunk: forwarding thread {main_ns / chunks / 1e3:5.2f}, "
                  f"other threads {rest_ns / chunks / 1e3:5.2f}, "
                  f"all {(main_ns + rest_ns) / chunks / 1e3:5.2f}; chunk delay p99 "
                  f"{po.ms(p99)} ms ({len(delays)} chunks matched)")
    if not rows[False] or not rows[True]:
        return failed("no chunk reached the load generator in some phase: nothing to compare"
                      + (f" (the proxy's last words: {llm.last_words()})"
                         if llm.proc.poll() is not None else ""))
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
    quiet, polled = med[False], med[True]
    d_all = (polled[0] + polled[1]) / (quiet[0] + quiet[1]) - 1
    print(f"median quiet : forwarding {quiet[0]:.2f} + other {quiet[1]:.2f} = "
          f"{quiet[0] + quiet[1]:.2f} µs/chunk")
    print(f"median polled: forwarding {polled[0]:.2f} + other {polled[1]:.2f} = "
          f"{polled[0] + polled[1]:.2f} µs/chunk")
    print(f"Δ CPU per chunk with the poller: {d_all * 100:+.1f}% (target ≤ 5%); other "
          f"threads alone {polled[1] - quiet[1]:+.2f} µs/chunk = "
          f"{(polled[1] - quiet[1]) * quiet[2] / 1e3:.2f} ms/s")
    if p99s[False] and p99s[True]:
        dq, dp = statistics.median(p99s[False]), statistics.median(p99s[True])
        print(f"chunk delay p99 (engine write → client read), median of the phases: quiet "
              f"{dq * 1e3:.2f} ms, polled {dp * 1e3:.2f} ms: Δ {(dp - dq) * 1e3:+.2f} ms "
              "(target ≤ 0.1 ms)")
    else:
        print("chunk delay: no chunk matched the simulator's ground truth in some phase")
    if with_polls:
        print(f"({with_polls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
