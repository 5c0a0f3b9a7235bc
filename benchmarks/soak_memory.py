"""Long-running soak for memory, fds and threads: RSS/fds/threads of the proxy over time.

Starts ``llmtop sim --firehose`` as the upstream and ``python -m llmtop run --headless``
(optionally ``--workers N``, ``--record`` with rotation) in front of it, then drives it at a
paced rate with many distinct users (``X-LLMTOP-User: u-<n>`` on half the requests),
API keys (``Authorization: Bearer k-<n>``: the user of the other half) and models, with a
mix of upstream faults (``X-Sim-Fault``: ``status:500``, ``disconnect-after:2``) and
clients that hang up mid-stream. Every
``--sample-s`` it prints one line: requests done, VmRSS / fds / threads of the proxy process
(the coordinator with ``--workers``, and the sum over its children), the admin snapshot's
size and latency, and ``/metrics``'s size::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/soak_memory.py --duration 600 --rate 250

Processes run with this checkout's code (``PYTHONPATH`` is set to the repository root).
Exit status 0; 3 when the proxy died or no request was answered.

Measured on the shared 2-core CI machine (``--rate 150 --duration 420``, 63,000 requests):
one process 59.6 MB at start, 75.7 MB at 150 s, 81.3 at 240 s, then 80-83 MB to the end
(the bounded structures full: the 300 s windows, the 150-point series, the detectors'
330 s horizon, 500 recent requests); fds 24-30 under load, 24 after; 8 threads. With
``--workers 2 --record``: the coordinator the same (60.1 -> 85.3 MB at most, 82.9 at the
end), the two workers 118.6 -> 120.5 MB together, 3 parts of 2 MB on disk. Before
9a1e0e2 the observers' tick could die on a race and RSS then grew ~0.65 kB a request
without end (142 MB at 118,000 requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT)}


def _wait(path: Path, names: tuple[str, ...], proc: subprocess.Popen[bytes]) -> dict[str, str]:
    rx = re.compile(r"llmtop: (\w+) listening on (\S+)")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = dict(rx.findall(path.read_text(errors="replace")))
        if all(n in found for n in names):
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"{proc.args!r} did not start: {path.read_text(errors='replace')}")


def _proc_stat(pid: int) -> tuple[int, int, int]:
    """(VmRSS kB, open fds, threads) of ``pid``; zeros once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
        thr = int(re.search(r"Threads:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds, thr
    except (OSError, AttributeError):
        return 0, 0, 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _get(url: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            n = len(r.read())
    except OSError:
        return -1, time.perf_counter() - t0
    return n, time.perf_counter() - t0


class Counts:
    def __init__(self) -> None:
        self.sent = self.ok = self.failed = self.cancelled = 0


async def _one(session: aiohttp.ClientSession, url: str, args: argparse.Namespace,
               rng: random.Random, c: Counts) -> None:
    headers = {"Authorization": f"Bearer k-{rng.randrange(args.keys)}"}
    if rng.random() < 0.5:  # else the user is the key's pseudonym
        headers["X-LLMTOP-User"] = f"u-{rng.randrange(args.users)}"
    r = rng.random()
    if r < 0.05:
        headers["X-Sim-Fault"] = "status:500"
    elif r < 0.08:
        headers["X-Sim-Fault"] = "disconnect-after:2"
    hang_up = 0.08 <= r < 0.11
    stream = rng.random() < 0.9
    body = {"model": f"m-{rng.randrange(args.models)}", "stream": stream,
            "max_tokens": rng.randint(4, args.max_tokens),
            "messages": [{"role": "user", "content": "hello " * rng.randint(1, 20)}]}
    c.sent += 1
    try:
        async with session.post(url + "/v1/chat/completions", json=body,
                                headers=headers) as resp:
            if hang_up:
                await resp.content.readany()
                resp.close()  # the client goes away mid-stream
                c.cancelled += 1
                return
            await resp.read()
            if resp.status == 200:
                c.ok += 1
            else:
                c.failed += 1
    except (aiohttp.ClientError, TimeoutError):
        c.failed += 1


async def _drive(url: str, args: argparse.Namespace, c: Counts, stop: threading.Event) -> None:
    rng = random.Random(args.seed)
    conn = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.monotonic()
        n = 0
        while not stop.is_set():
            due = t0 + n / args.rate
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            if len(tasks) < args.concurrency:
                t = asyncio.create_task(_one(session, url, args, rng, c))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.wait(tasks, timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load (300)")
    p.add_argument("--rate", type=float, default=200.0, help="requests per second (200)")
    p.add_argument("--concurrency", type=int, default=256, help="open requests at most")
    p.add_argument("--users", type=int, default=50_000, help="distinct users (50,000)")
    p.add_argument("--keys", type=int, default=20_000, help="distinct API keys (20,000)")
    p.add_argument("--models", type=int, default=500, help="distinct models (500)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--record", action="store_true", help="record, rotating every 2 MB")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--after-s", type=float, default=30.0,
                   help="seconds sampled after the load stops (30): what is given back")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="also write the samples as JSON here")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="llmtop-soak-mem-"))
    sim_out = work / "sim.out"
    with open(sim_out, "wb") as fh:
        sim = subprocess.Popen([sys.executable, "-m", "llmtop", "sim", "--listen",
                                "127.0.0.1:0", "--profile", "tiny", "--firehose"],
                               stdout=fh, stderr=subprocess.STDOUT, env=_env())
    procs = [sim]
    try:
        sim_url = _wait(sim_out, ("sim",), sim)["sim"]
        extra = ["--workers", str(args.workers)] if args.workers > 1 else []
        if args.record:
            extra += ["--record", str(work / "rec.jsonl"), "--rotate-mb", "2", "--keep", "3"]
        out = work / "llmtop.out"
        with open(out, "wb") as fh:
            proxy = subprocess.Popen(
                [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sim_url,
                 "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", *extra],
                stdout=fh, stderr=subprocess.STDOUT, env=_env())
        procs.append(proxy)
        found = _wait(out, ("proxy", "admin"), proxy)
        return _soak(found["proxy"], found["admin"], proxy, args, work)
    finally:
        for pr in reversed(procs):
            if pr.poll() is None:
                pr.kill()
                pr.wait(10)


def _soak(url: str, admin: str, proxy: subprocess.Popen[bytes], args: argparse.Namespace,
          work: Path) -> int:
    c = Counts()
    stop = threading.Event()
    driver = threading.Thread(target=lambda: asyncio.run(_drive(url, args, c, stop)),
                              daemon=True)
    samples: list[dict[str, Any]] = []
    print(f"# work dir {work}; rate {args.rate}/s, {args.users} users, {args.keys} keys, "
          f"{args.models} models, workers {args.workers}, record {args.record}", flush=True)
    print(f"{'t_s':>6} {'sent':>8} {'ok':>8} {'fail':>6} {'hangup':>6} {'rss_MB':>7} "
          f"{'fds':>5} {'thr':>4} {'kids_MB':>8} {'kfds':>5} {'snap_kB':>8} {'snap_ms':>8} "
          f"{'metr_kB':>8}", flush=True)
    t0 = time.monotonic()
    driver.start()
    end = t0 + args.duration
    while True:  # one sample at least every sample_s, one when the load stops, one at the end
        now = time.monotonic()
        rss, fds, thr = _proc_stat(proxy.pid)
        kids = [_proc_stat(k) for k in _children(proxy.pid)]
        snap_n, snap_s = _get(admin + "/llmtop/v1/snapshot")
        met_n, _ = _get(admin + "/metrics")
        s = {"t_s": round(now - t0, 1), "sent": c.sent, "ok": c.ok, "failed": c.failed,
             "hangup": c.cancelled, "rss_kb": rss, "fds": fds, "threads": thr,
             "kids_rss_kb": sum(k[0] for k in kids), "kids_fds": sum(k[1] for k in kids),
             "snapshot_bytes": snap_n, "snapshot_ms": round(snap_s * 1000, 1),
             "metrics_bytes": met_n}
        samples.append(s)
        print(f"{s['t_s']:>6.0f} {c.sent:>8} {c.ok:>8} {c.failed:>6} {c.cancelled:>6} "
              f"{rss / 1024:>7.1f} {fds:>5} {thr:>4} {s['kids_rss_kb'] / 1024:>8.1f} "
              f"{s['kids_fds']:>5} {snap_n / 1024:>8.1f} {s['snapshot_ms']:>8.1f} "
              f"{met_n / 1024:>8.1f}", flush=True)
        if proxy.poll() is not None or now >= end + args.after_s:
            break
        if now >= end and not stop.is_set():
            stop.set()
            driver.join(40)
            print("# load stopped", flush=True)
        nxt = end if now < end else end + args.after_s
        time.sleep(max(0.0, min(args.sample_s, nxt - time.monotonic())))
    stop.set()
    driver.join(40)
    if args.out:
        Path(args.out).write_text(json.dumps(samples, indent=1))
    if proxy.poll() is not None:
        print(f"proxy exited {proxy.returncode}", file=sys.stderr)
        return 3
    return 0 if c.ok else 3


if __name__ == "__main__":
    sys.exit(main())
