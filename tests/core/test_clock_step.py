"""The real ``llmtop run --headless`` keeps correct windows when the system clock steps.

The proxy runs in a process whose ``time.time`` is replaced, before llmtop is imported, by
the real wall clock plus an offset that the test steps with signals (SIGUSR1: +25 s,
SIGUSR2: -25 s) — what an NTP step or ``date -s`` does to a running proxy. Clients stream
from the built-in simulator through it; what they receive is the truth. The 10 s window's
tok/s must stay near the truth through both steps, the fine intervals must keep closing
every 2 s, and the recording's times must stay on one timeline."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import signal
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.sim.server import running_sim

LISTEN = "llmtop: proxy listening on "
ADMIN = "llmtop: admin listening on "
STEP_S = 25.0

# runs `llmtop run` with a time.time that the test steps; prints each step
STEPPED_RUN = f"""
import runpy, signal, sys, time
real, offset = time.time, [0.0]
time.time = lambda: real() + offset[0]
def step(sig, frame):
    offset[0] += {STEP_S} if sig == signal.SIGUSR1 else -{STEP_S}
    print(f"stepped {{offset[0]:+.0f}}", flush=True)
signal.signal(signal.SIGUSR1, step)
signal.signal(signal.SIGUSR2, step)
sys.argv = ["llmtop", *sys.argv[1:]]
runpy.run_module("llmtop", run_name="__main__", alter_sys=True)
"""


async def start_stepped_run(*args: str) -> tuple[asyncio.subprocess.Process, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STEPPED_RUN,
        "run",
        "--headless",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    proxy = admin = ""
    while not (proxy and admin):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "llmtop run exited before announcing its addresses"
        if line.startswith(LISTEN):
            proxy = line[len(LISTEN) :].strip()
        elif line.startswith(ADMIN):
            admin = line[len(ADMIN) :].strip()
    return proc, proxy, admin


async def step(proc: asyncio.subprocess.Process, sig: signal.Signals, offset: str) -> None:
    """Step the proxy's wall clock and wait until it says so."""
    assert proc.stdout is not None
    proc.send_signal(sig)
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line, "llmtop run exited"
        if line.startswith("stepped"):
            assert line.split()[1] == offset
            return


async def test_windows_and_records_ignore_steps_of_the_wall_clock(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    chunk_at: list[float] = []  # monotonic time of every content chunk the clients got
    samples: list[tuple[float, dict[str, Any]]] = []  # (monotonic, 10 s snapshot)
    async with running_sim("tiny", seed=5) as sim:
        proc, proxy, admin = await start_stepped_run(
            "--upstream",
            sim.url,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--record",
            str(rec),
            "--gpu-source",
            "none",
        )
        try:
            body = json.dumps(
                {
                    "model": "sim-tiny",
                    "max_tokens": 24,
                    "stream": True,
                    "messages": [{"role": "user", "content": "hello"}],
                }
            )
            stop = False
            async with aiohttp.ClientSession() as s:

                async def client() -> None:
                    while not stop:
                        async with s.post(
                            proxy + "/v1/chat/completions",
                            data=body,
                            headers={"Content-Type": "application/json"},
                        ) as r:
                            assert r.status == 200
                            async for line in r.content:
                                if not line.startswith(b"data: {"):
                                    continue
                                d = json.loads(line[6:])
                                if d.get("choices") and d["choices"][0]["delta"].get("content"):
                                    chunk_at.append(time.monotonic())

                async def sample(n: int) -> None:
                    # (n samples, 0.5 s apart or more: a count, not a duration, so a
                    # slow machine takes fewer seconds' worth of checks, never fewer checks)
                    for _ in range(n):
                        await asyncio.sleep(0.5)
                        async with s.get(admin + "/llmtop/v1/snapshot?window=10") as r:
                            snap = await r.json()
                        samples.append((time.monotonic(), snap))

                clients = [asyncio.create_task(client()) for _ in range(3)]
                t_traffic = time.monotonic()
                await sample(6)
                await step(proc, signal.SIGUSR1, "+25")
                await sample(8)
                await step(proc, signal.SIGUSR2, "+0")
                await sample(8)
                stop = True
                await asyncio.gather(*clients)
        finally:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
    t_end = time.monotonic()

    # 1. the 10 s tok/s is what the clients received over the span it is divided by
    chunk_at.sort()
    checked = 0
    for t, snap in samples:
        if t - t_traffic < 2.0:
            continue  # the first second or two: too few tokens for a rate
        sysm = snap["system"]
        span = sysm["span_s"]
        truth = (bisect.bisect_right(chunk_at, t) - bisect.bisect_left(chunk_at, t - span)) / span
        assert truth > 20, (t - t_traffic, truth)
        assert 0.6 * truth <= sysm["output_tps"] <= 1.4 * truth, (
            round(t - t_traffic, 1),
            sysm["output_tps"],
            truth,
            span,
        )
        checked += 1
    assert checked >= 16  # every sample after the first step (3 s in, at least) is checked

    # 2. llmtop's clock moved as the test's did: no 25 s jumps either way
    (t0, first), (t1, last) = samples[0], samples[-1]
    assert last["time"] - first["time"] == pytest.approx(t1 - t0, abs=1.0)
    for (ta, a), (tb, b) in pairwise(samples):
        assert abs((b["time"] - a["time"]) - (tb - ta)) < 1.0

    # 3. the fine intervals kept closing every 2 s, through both steps
    series = [p["t"] for p in last["series"]]
    assert len(series) >= int((t1 - t_traffic) / 2.0) - 1, series
    assert all(b - a == 2.0 for a, b in pairwise(series)), series
    assert last["time"] - 3.0 <= series[-1] <= last["time"]

    # 4. the recording is on the same timeline: every request within the run
    with RecordingReader(rec) as reader:
        starts = [e.t_start for e in reader if isinstance(e, RequestRecord)]
        started_at, footer = reader.header["started_at"], reader.footer
    assert footer is not None and len(starts) >= 20
    assert footer["ended_at"] - started_at == pytest.approx(t_end - t_traffic, abs=3.0)
    # (the recorder starts just after the proxy: a request may begin a moment before)
    assert all(started_at - 1.0 <= t <= footer["ended_at"] for t in starts), (
        started_at,
        min(starts),
        max(starts),
        footer["ended_at"],
    )
