"""The soak: N concurrent streams from the simulator through ``llmtop run --headless`` with
recording on, for a bounded time. Used by test_rel_soak.py, and runnable by hand for
bigger or longer runs::

    .venv/bin/python tests/reliability/soak_driver.py --concurrency 1024 --duration 60

Three processes besides this one, so that what is measured is the proxy alone: the
simulator (``llmtop sim``), the proxy (``python -m llmtop run --headless``, whose
``/proc/<pid>`` gives RSS and open fds), and a poller (this file with ``--poll``) that
times ``GET /llmtop/v1/snapshot`` on the admin port with a blocking socket, away from the
client's busy event loop, and samples the proxy's RSS and fds once a second.

Every client request carries a unique ``X-LLMTOP-User`` (``soak-<worker>-<n>``): the
recording's ``request`` lines keep the user, which is how each request is matched to
exactly one record. The result is one JSON object (``--out`` or stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
SIM_SETTINGS = {
    # every running sequence gets a token each step; the step time does not grow with the
    # batch, so 1,024 streams each see a chunk every step_s
    "max_num_seqs": 4096, "kv_cache_tokens": 4_000_000, "max_model_len": 4096,
    "per_seq_s": 0, "per_kv_token_s": 0, "prefill_tokens_per_s": 1e9,
}


def _env() -> dict[str, str]:
    return {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1"}


def _wait_line(path: Path, pattern: str, proc: subprocess.Popen[bytes],
               within_s: float = 30.0) -> dict[str, str]:
    rx = re.compile(pattern)
    deadline = time.monotonic() + within_s
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        for m in rx.finditer(path.read_text(errors="replace")):
            found[m.group(1)] = m.group(2)
        if found and proc.poll() is None and (len(found) >= pattern.count("|") + 1):
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args!r} did not start: {path.read_text(errors='replace')}")


@dataclass
class Procs:
    """The simulator and the proxy, started by :func:`start_stack`."""

    sim: subprocess.Popen[bytes]
    proxy: subprocess.Popen[bytes]
    sim_url: str
    proxy_url: str
    admin_url: str
    record: Path
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for p in (self.proxy, self.sim):
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def start_sim(work: Path, step_s: float, name: str = "sim") -> tuple[subprocess.Popen[bytes],
                                                                      str, Path]:
    out = work / f"{name}.out"
    args = [sys.executable, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0",
            "--profile", "tiny", "--set", f"base_step_s={step_s}"]
    for k, v in SIM_SETTINGS.items():
        args += ["--set", f"{k}={v}"]
    with open(out, "wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=_env())
    found = _wait_line(out, r"llmtop: (sim) listening on (\S+)", proc)
    return proc, found["sim"], out


def start_proxy(work: Path, upstream: str, record: Path, *, env: dict[str, str] | None = None,
                name: str = "llmtop", extra: tuple[str, ...] = ()
                ) -> tuple[subprocess.Popen[bytes], str, str, list[Path]]:
    out, err = work / f"{name}.out", work / f"{name}.err"
    args = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
            "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", str(record),
            *extra]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(args, stdout=o, stderr=e, env={**_env(), **(env or {})})
    found = _wait_line(out, r"llmtop: (proxy|admin) listening on (\S+)", proc)
    return proc, found["proxy"], found["admin"], [out, err]


def start_stack(work: Path, *, step_s: float = 0.25, env: dict[str, str] | None = None,
                record_name: str = "soak.jsonl", extra: tuple[str, ...] = ()) -> Procs:
    sim, sim_url, sim_out = start_sim(work, step_s)
    try:
        proxy, purl, aurl, logs = start_proxy(work, sim_url, work / record_name, env=env,
                                              extra=extra)
    except BaseException:
        sim.kill()
        sim.wait(10)
        raise
    return Procs(sim, proxy, sim_url, purl, aurl, work / record_name, [sim_out, *logs])


# -- the load -----------------------------------------------------------------------------


@dataclass
class Load:
    """What the clients did: one entry per request sent."""

    sent: list[str] = field(default_factory=list)
    """Users (unique per request) in the order the requests were sent."""
    results: dict[str, str] = field(default_factory=dict)
    """user → "ok" or a short error description."""
    bytes_in: int = 0


def chat_body(max_tokens: int) -> bytes:
    return json.dumps({"model": "sim-tiny", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "soak"}]}).encode()


async def run_load(proxy_url: str, concurrency: int, duration_s: float, *, max_tokens: int = 8,
                   load: Load | None = None, stop: asyncio.Event | None = None,
                   prefix: str = "soak", stagger_s: float = 0.0) -> Load:
    """``concurrency`` workers, each sending streaming chats one after another until
    ``duration_s`` has passed (or ``stop`` is set); in-flight requests are finished.

    With ``stagger_s`` the workers start at random times within it and ask for
    ``max_tokens`` ± 50 %, so requests do not start and end in lock-step waves."""
    import random

    import aiohttp

    load = load or Load()
    rng = random.Random(1)
    bodies = ([chat_body(n) for n in range(max(1, max_tokens // 2), max_tokens * 3 // 2 + 1)]
              if stagger_s else [chat_body(max_tokens)])
    deadline = time.monotonic() + duration_s
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

        async def worker(w: int) -> None:
            n = 0
            if stagger_s:
                await asyncio.sleep(rng.uniform(0, stagger_s))
            while time.monotonic() < deadline and not (stop and stop.is_set()):
                body = rng.choice(bodies)
                user = f"{prefix}-{w}-{n}"
                n += 1
                load.sent.append(user)
                try:
                    async with s.post(proxy_url + "/v1/chat/completions", data=body,
                                      headers={"X-LLMTOP-User": user,
                                               "Content-Type": "application/json"}) as r:
                        data = await r.read()
                    load.bytes_in += len(data)
                    if r.status != 200:
                        load.results[user] = f"HTTP {r.status}"
                    elif not data.rstrip().endswith(b"data: [DONE]"):
                        load.results[user] = "stream without [DONE]"
                    else:
                        load.results[user] = "ok"
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    load.results[user] = type(exc).__name__

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return load


# -- the poller (a separate process) -------------------------------------------------------


def _proc_rss_fds(pid: int) -> tuple[int, int, float]:
    """RSS bytes, open fds and CPU seconds used so far by process ``pid``."""
    rss = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, len(os.listdir(f"/proc/{pid}/fd")), cpu


def poll_main(admin_url: str, pid: int, duration_s: float, interval_s: float,
              token: str = "") -> dict[str, Any]:
    """Time the snapshot route; sample the proxy's RSS and fds once a second."""
    u = urlsplit(admin_url)
    lat: list[float] = []
    failures: list[str] = []
    samples: list[tuple[float, int, int, float]] = []
    timeline: list[tuple[float, float]] = []
    t0p = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    t0 = time.monotonic()
    next_sample = t0
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    while time.monotonic() - t0 < duration_s:
        now = time.monotonic()
        if now >= next_sample:
            with contextlib.suppress(OSError):
                rss, fds, cpu = _proc_rss_fds(pid)
                samples.append((now - t0, rss, fds, cpu))
            next_sample += 1.0
        t = time.perf_counter()
        try:
            conn.request("GET", "/llmtop/v1/snapshot?window=10", headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            took = time.perf_counter() - t
            if resp.status != 200 or not data.startswith(b"{"):
                failures.append(f"HTTP {resp.status}")
            else:
                lat.append(took)
                timeline.append((round(t - t0p, 2), round(took * 1e3, 1)))
        except (OSError, http.client.HTTPException) as exc:
            failures.append(type(exc).__name__)
            conn.close()
            conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
        time.sleep(interval_s)
    conn.close()
    return {"latencies_s": lat, "failures": failures, "samples": samples,
            "timeline": timeline}


def start_poller(admin_url: str, pid: int, duration_s: float, out: Path,
                 interval_s: float = 0.1) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "soak_driver.py"), "--poll", admin_url, "--pid", str(pid),
         "--duration", str(duration_s), "--interval", str(interval_s), "--out", str(out)],
        env=_env())


# -- the whole soak -----------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def read_request_records(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every request line of a recording, via llmtop's own reader, and its summary."""
    from llmtop.events import RequestRecord
    from llmtop.recording.reader import RecordingReader

    recs: list[dict[str, Any]] = []
    with RecordingReader(path) as r:
        for ev in r:
            if isinstance(ev, RequestRecord):
                recs.append(ev.to_json_dict())
        summary = r.summary()
    return recs, summary


async def soak(concurrency: int, duration_s: float, work: Path, *, step_s: float = 0.25,
               max_tokens: int = 8, workers: int = 1, stagger_s: float = 0.0
               ) -> dict[str, Any]:
    """Run the soak and return its figures (see the module docstring)."""
    procs = start_stack(work, step_s=step_s,
                        extra=("--workers", str(workers)) if workers > 1 else ())
    try:
        poll_out = work / "poll.json"
        poller = start_poller(procs.admin_url, procs.proxy.pid, duration_s, poll_out)
        t = time.monotonic()
        load = await run_load(procs.proxy_url, concurrency, duration_s, max_tokens=max_tokens,
                              stagger_s=stagger_s)
        load_s = time.monotonic() - t
        poller.wait(duration_s + 60)
        await asyncio.sleep(1.0)
        rss_after, fds_after, _ = _proc_rss_fds(procs.proxy.pid)
        poll = json.loads(poll_out.read_text())
        procs.proxy.send_signal(signal.SIGTERM)
        rc = procs.proxy.wait(60)
        records, summary = read_request_records(procs.record)
    finally:
        procs.stop()
    users = Counter(r["user"] for r in records)
    sent = Counter(load.sent)
    by_outcome = Counter(r["outcome"] for r in records)
    client = Counter(load.results.values())
    samples = poll["samples"]
    warm = [s for s in samples if s[0] >= min(30.0, duration_s / 2)]
    lat = poll["latencies_s"]
    return {
        "concurrency": concurrency,
        "duration_s": round(load_s, 1),
        "requests_sent": len(load.sent),
        "requests_unique": len(sent),
        "records": len(records),
        "records_unique_users": len(users),
        "missing_records": sorted(set(sent) - set(users))[:20],
        "missing_count": len(set(sent) - set(users)),
        "duplicate_records": sorted(u for u, n in users.items() if n > 1)[:20],
        "unexpected_records": sorted(set(users) - set(sent))[:20],
        "record_outcomes": dict(by_outcome),
        "record_errors": Counter(r["error"] for r in records if r["outcome"] != "ok"
                                 ).most_common(5),
        "client_results": dict(client),
        "proxy_exit": rc,
        "recording": summary,
        "rps": round(len(load.sent) / load_s, 1),
        "rss_start_mb": round(warm[0][1] / 2**20, 1) if warm else None,
        "rss_end_mb": round(warm[-1][1] / 2**20, 1) if warm else None,
        "rss_first_mb": round(samples[0][1] / 2**20, 1) if samples else None,
        "rss_max_mb": round(max(s[1] for s in samples) / 2**20, 1) if samples else None,
        "fds_start": warm[0][2] if warm else None,
        "fds_end": warm[-1][2] if warm else None,
        "fds_max": max(s[2] for s in samples) if samples else None,
        "fds_first": samples[0][2] if samples else None,
        "fds_after_load": fds_after,
        "rss_after_load_mb": round(rss_after / 2**20, 1),
        "admin_polls": len(lat),
        "admin_failures": poll["failures"][:10],
        "admin_p50_ms": round(1e3 * (percentile(lat, 0.50) or 0), 1),
        "admin_p99_ms": round(1e3 * (percentile(lat, 0.99) or 0), 1),
        "admin_max_ms": round(1e3 * max(lat), 1) if lat else None,
        "admin_slowest": sorted(poll["timeline"], key=lambda x: -x[1])[:10],
        "proxy_cpu_share": round((samples[-1][3] - samples[0][3])
                                 / max(samples[-1][0] - samples[0][0], 1e-9), 2)
        if len(samples) > 1 else None,
        "warm_samples": [(round(a), round(b / 2**20, 1), c) for a, b, c, _ in warm][:: 5],
        "logs_tail": procs.output()[-2000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--step", type=float, default=0.25, help="sim step (s between chunks)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1, help="llmtop run --workers N")
    ap.add_argument("--stagger", type=float, default=0.0, metavar="S",
                    help="start workers at random within S seconds, max_tokens ±50%%")
    ap.add_argument("--out", help="write the JSON result here")
    ap.add_argument("--poll", metavar="ADMIN_URL", help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--interval", type=float, default=0.1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poll:
        res = poll_main(args.poll, args.pid, args.duration, args.interval)
    else:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        with tempfile.TemporaryDirectory() as d:
            res = asyncio.run(soak(args.concurrency, args.duration, Path(d), step_s=args.step,
                                   max_tokens=args.max_tokens, workers=args.workers,
                                   stagger_s=args.stagger))
    text = json.dumps(res, indent=None if args.poll else 1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
