"""Synthetic, deterministic sessions for the recording tests (no proxy needed)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from llmtop.clock import unix_now
from llmtop.events import EngineReading, Event, GpuReading, RequestRecord, WarningEvent
from llmtop.recording.writer import Recorder

T0 = float(int(time.time()))
"""An instant for events whose time does not matter: now (a whole second), since a reader
drops events a day or more before a recording's start as damaged — a fixed date would
make these tests fail from the day after it."""


def soon() -> float:
    """A whole second shortly after now: sessions start just after the recorder does (a
    recording's events come after its header's started_at, as in real life)."""
    return float(int(time.time())) + 10.0


def request(i: int, t_start: float, *, user: str = "alice", model: str = "m-8b",
            outcome: str = "ok", ttft: float = 0.2, gap: float = 0.02, n_chunks: int = 10,
            tokens_per_chunk: int = 1, concurrency: int = 1, prompt: int = 100) -> RequestRecord:
    offs = tuple(round(ttft + k * gap, 6) for k in range(n_chunks)) if outcome == "ok" else ()
    toks = tuple(tokens_per_chunk for _ in offs)
    e2e = (offs[-1] + 0.001) if offs else ttft
    return RequestRecord(
        id=f"r{i}", user=user, model=model, dialect="openai", path="/v1/chat/completions",
        stream=True, status=200 if outcome == "ok" else 500, outcome=outcome,  # type: ignore[arg-type]
        t_start=t_start, ttft_s=ttft if offs else None, e2e_s=e2e, prompt_tokens=prompt,
        completion_tokens=sum(toks) if offs else None, token_source="usage",
        chunk_offsets_s=offs, chunk_tokens=toks, concurrency_at_start=concurrency,
        error=None if outcome == "ok" else "upstream 500",
    )


def session(n: int = 200, *, seed: int = 1, duration_s: float = 60.0, model: str = "m-8b",
            users: tuple[str, ...] = ("alice", "bob", "carol"), max_conc: int = 8,
            errors_every: int = 37, timeouts_every: int = 53, prompt_mean: int = 100,
            gpus: int = 1, t0: float | None = None) -> list[Event]:
    """A session whose latency rises with concurrency (a knee around max_conc/2), with GPU
    and engine readings every second and a warning raised then cleared; time ordered by
    when each event happened (requests at their end)."""
    rnd = random.Random(seed)
    start = soon() if t0 is None else t0
    out: list[tuple[float, Event]] = []
    for i in range(n):
        t = start + duration_s * i / n
        conc = 1 + int((max_conc - 1) * i / max(1, n - 1))
        load = max(0.0, conc - max_conc / 2)
        ttft = 0.05 + 0.01 * conc + 0.15 * load + rnd.random() * 0.02
        gap = 0.01 + 0.004 * load + rnd.random() * 0.002
        outcome = "ok"
        if errors_every and i % errors_every == errors_every - 1:
            outcome = "error"
        elif timeouts_every and i % timeouts_every == timeouts_every - 1:
            outcome = "timeout"
        rec = request(i, t, user=users[i % len(users)], model=model, outcome=outcome, ttft=ttft,
                      gap=gap, n_chunks=5 + rnd.randrange(20), tokens_per_chunk=1 + i % 2,
                      concurrency=conc, prompt=max(1, int(rnd.gauss(prompt_mean, 10))))
        out.append((t + rec.e2e_s, rec))
    for s in range(int(duration_s) + 1):
        t = start + s
        for g in range(gpus):
            out.append((t, GpuReading(t=t, index=g, name="Sim H200", mem_used_bytes=(60 + s % 40)
                                      * 2**30, mem_total_bytes=141 * 2**30, util_gpu=50.0 + s % 50,
                                      mem_busy=40.0, dram_bw_util=30.0 + s % 60, power_w=400.0,
                                      simulated=True)))
        out.append((t, EngineReading(t=t, kind="sim", running=float(s % 8), waiting=float(s % 3),
                                     kv_cache_usage=(s % 100) / 100, preemptions=0.0,
                                     ttft_buckets=((0.1, 1.0), (1.0, 2.0), (math.inf, 3.0)),
                                     raw={"vllm:num_requests_running": float(s % 8)})))
    out.append((start + duration_s * 0.6, WarningEvent(t=start + duration_s * 0.6, code="QUEUEING",
                                                     severity="warning", message="queue grows",
                                                     state="raised")))
    out.append((start + duration_s * 0.9, WarningEvent(t=start + duration_s * 0.9, code="QUEUEING",
                                                     severity="warning", message="queue drained",
                                                     state="cleared")))
    out.sort(key=lambda p: p[0])
    return [e for _, e in out]


def write_recording(path: Path, events: list[Event], *, header: dict[str, Any] | None = None,
                    stop: bool = True) -> Recorder:
    rec = Recorder(path, header=header or {"upstream": "http://127.0.0.1:9/v1",
                                           "slo": {"ttft_s": 0.5, "itl_p95_s": 0.05,
                                                   "target": 0.95}},
                   flush_s=0.2)
    rec.start()
    for i in range(0, len(events), 50):
        rec.on_events(events[i:i + 50])
    if stop:
        rec.stop()
    return rec


def chunked(xs: list[Event], n: int) -> Iterator[list[Event]]:
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


class FakeDisk:
    """A file the recorder writes through (its ``opener``): every call goes to a real file;
    subclasses change ``write`` to make a disk slow, stalled or full."""

    def __init__(self, path: Path) -> None:
        self._fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        self._fh.close()


class FullDisk(FakeDisk):
    """The header gets through, then the disk is full."""

    def write(self, data: bytes) -> int:
        if self.writes >= 1:
            raise OSError(28, "No space left on device")
        return super().write(data)


def feed(rec: Recorder, n: int, *, first: int = 0) -> None:
    """``n`` requests (ids ``first``…), ten at a time (~3.5 kB of lines), each ten written
    before the next are given (however busy the machine, each batch is a writer pass of
    its own)."""
    for i in range(first, first + n, 10):
        now = unix_now()
        rec.on_events([request(k, now - 1.0) for k in range(i, min(i + 10, first + n))])
        deadline = time.monotonic() + 30
        while rec.status()["queued"] and time.monotonic() < deadline:
            time.sleep(0.01)


def written_late(times: list[float]) -> int:
    """How many of a file's line times come after a later one (the writer's
    ``out_of_order``: lines that reached it after its hold)."""
    newest, late = -math.inf, 0
    for t in times:
        late += t < newest
        newest = max(newest, t)
    return late
