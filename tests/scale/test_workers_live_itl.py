"""`llmtop run --workers 2`: an open stream's ITL samples reach the coordinator's windows
while it streams (its chunk slices cross the ingest wire like its record), each sample is
counted once after its record, and the recording holds the record, never the slices."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
from test_workers import start_run

from llmtop.events import RequestRecord
from llmtop.recording.reader import iter_recording
from llmtop.sim.server import running_sim


async def test_a_long_streams_itl_shows_on_the_coordinator_while_it_is_open(tmp_path: Path) -> None:
    rec_path = tmp_path / "w.jsonl"
    async with running_sim("tiny", seed=9, time_scale=0.3) as sim:
        proc, proxy, admin = await start_run(
            "--upstream",
            sim.url,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--record",
            str(rec_path),
            "--gpu-source",
            "none",
        )
        try:
            body = json.dumps(
                {
                    "model": "m",
                    "max_tokens": 1_900,
                    "stream": True,
                    "messages": [{"role": "user", "content": "hello"}],
                }
            )
            async with aiohttp.ClientSession() as s:

                async def snapshot(window: str) -> dict[str, Any]:
                    async with s.get(f"{admin}/llmtop/v1/snapshot?window={window}") as r:
                        out: dict[str, Any] = await r.json()
                        return out

                async def stream() -> None:
                    async with s.post(
                        proxy + "/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        await r.read()

                task = asyncio.create_task(stream())
                mid: dict[str, Any] | None = None
                while not task.done():
                    await asyncio.sleep(0.1)
                    snap = await snapshot("10")
                    if snap["system"]["requests"] == 0 and snap["latency"]["itl"]["count"]:
                        mid = snap
                        break
                await task
                for _ in range(100):  # workers forward every 0.5 s
                    end = await snapshot("all")
                    if end["system"]["requests"] >= 1:
                        break
                    await asyncio.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
    assert mid is not None, "no ITL sample reached the coordinator while the stream was open"
    assert mid["system"]["in_flight"] == 1
    assert mid["latency"]["chunk_gap"]["count"] > 0
    lines = [json.loads(x) for x in rec_path.read_text().splitlines()]
    assert [x["type"] for x in lines if x["type"] in ("request", "chunks")] == ["request"]
    (record,) = [e for e in iter_recording(rec_path) if isinstance(e, RequestRecord)]
    offs, toks = record.chunk_offsets_s, record.chunk_tokens
    assert len(offs) > 1_024
    assert end["latency"]["chunk_gap"]["count"] == len(offs) - 1
    assert abs(end["latency"]["itl"]["count"] - sum(k for k in toks[1:] if k > 0)) <= 1
