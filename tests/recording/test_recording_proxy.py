"""Recording a real session: the simulator behind llmtop's proxy, clients on the openai SDK.

- Round trip: the recording, replayed through the same aggregation code, gives exactly the
  percentiles the live snapshot showed (read from the admin API).
- A disk that stalls: streams through the proxy finish while the recorder's write is still
  stuck; the recorder drops and counts lines instead of delaying anyone.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
from rec_helpers import FakeDisk, FullDisk

from llmtop.config import load_config
from llmtop.recording.reader import RecordingReader
from llmtop.recording.report.analyse import analyse
from llmtop.recording.writer import RecordingController
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

USERS = ("alice", "bob", "carol")
METRICS = ("ttft", "itl", "chunk_gap", "tpot", "e2e")


def server_for(upstream: str, **overrides: Any) -> LlmtopServer:
    cfg = load_config(None, env={}, overrides={
        "upstream": upstream, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
        "gpu.source": "sim", "gpu.interval_s": 0.2, "engine.interval_s": 0.2, **overrides,
    })
    return LlmtopServer(cfg, out=io.StringIO())


async def one_stream(c: openai.AsyncOpenAI, user: str, max_tokens: int) -> list[float]:
    """Stream one chat completion; returns the client-side arrival times of content chunks."""
    times: list[float] = []
    stream = await c.chat.completions.create(
        model="sim-tiny", messages=[{"role": "user", "content": "hello there"}],
        max_tokens=max_tokens, stream=True, extra_headers={"X-LLMTOP-User": user})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.monotonic())
    return times


async def traffic(url: str, n: int, concurrency: int) -> list[list[float]]:
    sem = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0) as c:

        async def one(i: int) -> list[float]:
            async with sem:
                return await one_stream(c, USERS[i % 3], 6 + (i * 7) % 20)

        return await asyncio.gather(*(one(i) for i in range(n)))


async def test_round_trip_gives_the_live_snapshots_percentiles(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl.gz"
    async with running_sim("tiny", seed=3) as sim:
        server = server_for(sim.url, **{"recording.path": str(path)})
        await server.start()
        try:
            await traffic(server.proxy_url, 36, 6)  # past max_num_seqs=4: some queueing
            deadline = time.monotonic() + 20.0
            while True:  # the bus pump and a metrics tick
                await asyncio.sleep(0.2)
                async with aiohttp.ClientSession() as s, s.get(
                        server.admin_url + "/llmtop/v1/snapshot",
                        params={"window": "all"}) as resp:
                    live = await resp.json()
                if live["system"]["requests"] >= 36 or time.monotonic() > deadline:
                    break
        finally:
            await server.stop()
    assert live["system"]["requests"] == 36
    report = analyse(path)
    for m in METRICS:
        got, want = report["latency"][m], live["latency"][m]
        for k in ("count", "p50", "p90", "p95", "p99", "max"):
            assert got[k] == want[k], (m, k, got[k], want[k])
    assert report["outcomes"]["requests"] == 36 and report["outcomes"]["ok"] == 36
    assert report["slo"]["attainment"] == live["system"]["slo_attainment"]
    assert {u["user"] for u in report["users"]} == set(USERS)
    assert report["conditions"]["models"] == {"sim-tiny": 36}
    assert report["conditions"]["concurrency_at_start"]["max"] >= 5
    assert report["gpus"] and report["gpus"][0]["simulated"] is True
    assert report["engine"]["kind"] is not None
    with RecordingReader(path) as r:
        list(r)
        assert r.footer is not None and r.footer["requests"] == 36 and r.footer["dropped"] == 0


class StuckDisk(FakeDisk):
    """A file whose writes after the header block until released (a stalled disk)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.stuck = threading.Event()
        self.release = threading.Event()

    def write(self, data: bytes) -> int:
        if self.writes >= 1:
            self.stuck.set()
            self.release.wait(30)
        return super().write(data)


async def test_a_stalled_disk_does_not_delay_streams(tmp_path: Path) -> None:
    path = tmp_path / "stalled.jsonl"
    disks: list[StuckDisk] = []

    def opener(p: Path, overwrite: bool) -> StuckDisk:
        disks.append(StuckDisk(p))
        return disks[-1]

    async with running_sim("tiny", seed=4) as sim:
        server = server_for(sim.url)
        ctl = RecordingController(server.bus, header={"upstream": sim.url}, queue_max=20,
                                  flush_s=0.2, opener=opener)  # type: ignore[arg-type]
        server.observers.recording = ctl
        await server.start()
        try:
            ctl.start(str(path))
            await traffic(server.proxy_url, 4, 4)  # the first lines reach the stuck write
            assert await asyncio.to_thread(disks[0].stuck.wait, 10)
            t0 = time.monotonic()
            streams = await traffic(server.proxy_url, 40, 8)
            elapsed = time.monotonic() - t0
            assert not disks[0].release.is_set()  # every stream ran while the disk was stuck
            status = ctl.status()
            assert status is not None and status["dropped"] > 0  # counted, not waited for
        finally:
            disks[0].release.set()
            await server.stop()  # drains the bus, then stops the recording
    done = ctl.last
    assert done is not None
    gaps = [b - a for s in streams for a, b in itertools.pairwise(s)]
    assert all(len(s) >= 6 for s in streams)
    # the simulator's decode step is ~15 ms; a stream waiting on the disk would see seconds
    assert max(gaps) < 1.0 and elapsed < 20
    assert done["dropped"] >= status["dropped"]
    assert done["requests"] + done["dropped_requests"] == 44
    with RecordingReader(path) as r:
        n = sum(1 for e in r if type(e).__name__ == "RequestRecord")
        assert r.footer is not None and r.footer["dropped"] == done["dropped"]
    assert n == done["requests"]


async def test_a_recording_that_failed_says_so_when_the_proxy_stops(tmp_path: Path) -> None:
    # `llmtop run --headless --record` on a disk that filled up ended with "recording
    # x.jsonl: 36 requests, 33 lines dropped" and no word of the failure (the file held 32).
    async with running_sim("tiny", seed=4) as sim:
        server = server_for(sim.url)
        ctl = RecordingController(server.bus, header={"upstream": sim.url}, flush_s=0.05,
                                  opener=lambda p, o: FullDisk(p))  # type: ignore[arg-type,return-value]
        server.observers.recording = ctl
        await server.start()
        try:
            ctl.start(str(tmp_path / "full.jsonl"))
            await traffic(server.proxy_url, 4, 4)
        finally:
            summary = await server.stop()
    note = next(n for n in summary.notes if "full.jsonl" in n)
    assert "No space left on device" in note, note
