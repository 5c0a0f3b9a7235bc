"""``llmtop run --workers 2``: a recording stopped through the admin API while streams are
open on the workers counts them in its footer's ``open_at_stop`` (every worker's, from
the coordinator's shared table), and its stop answer says so. Real processes and sockets:
the simulator behind the workers, streams held open with ``X-Sim-Fault: stall``."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest
from proc_support import start_headless

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.sim.server import running_sim

pytestmark = pytest.mark.timeout(120)

BODY = json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                   "messages": [{"role": "user", "content": "hello"}]})


async def chat(s: aiohttp.ClientSession, proxy: str, fault: str = "") -> bytes:
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["X-Sim-Fault"] = fault
    async with s.post(proxy + "/v1/chat/completions", data=BODY, headers=headers) as r:
        return await r.read()


async def test_workers_stop_counts_every_workers_open_requests(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    async with running_sim("tiny", max_num_seqs=16) as sim:
        proc, proxy, admin = await start_headless(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--gpu-source", "none")
        try:
            api = admin + "/llmtop/v1/recording"
            # a new connection per request, so the kernel spreads them over the workers
            conn = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=conn) as s:
                async with s.post(api, json={"action": "start", "path": str(path)}) as r:
                    assert r.status == 200, await r.text()
                await asyncio.gather(*(chat(s, proxy) for _ in range(4)))
                held = [asyncio.create_task(chat(s, proxy, "stall:30000@1"))
                        for _ in range(5)]
                # every worker's open requests reach the coordinator (forwarded every
                # 0.5 s) — and the four whole ones' records with them
                for _ in range(150):
                    async with s.get(admin + "/llmtop/v1/health") as r:
                        health = await r.json()
                    if health["in_flight"] == 5 and health["requests"] == 4:
                        break
                    await asyncio.sleep(0.1)
                assert (health["in_flight"], health["requests"]) == (5, 4), health
                async with s.post(api, json={"action": "stop"}) as r:
                    assert r.status == 200, await r.text()
                    done = await r.json()
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert done["open_at_stop"] == 5, done
    assert done["note"] == ("5 requests were still open when the recording stopped; they "
                            "are not in it")
    with RecordingReader(path) as rd:
        recs = [e for e in rd if isinstance(e, RequestRecord)]
        assert rd.footer is not None and rd.footer["open_at_stop"] == 5
    assert len(recs) == 4


async def test_workers_own_shutdown_leaves_none_open(tmp_path: Path) -> None:
    """``llmtop run --workers 2 --record``'s shutdown: the grace, then each worker cuts the
    streams still open (recorded ``cancelled``) and the recording stops after: its footer
    counts none open, and every stream is in it."""
    path = tmp_path / "w.jsonl"
    cfg = tmp_path / "c.toml"
    cfg.write_text("[timeouts]\nshutdown_grace_s = 0.3\n")
    async with running_sim("tiny", max_num_seqs=16) as sim:
        proc, proxy, admin = await start_headless(
            "--config", str(cfg), "--upstream", sim.url, "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0", "--workers", "2", "--gpu-source", "none",
            "--record", str(path))
        conn = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=conn) as s:
            held = [asyncio.create_task(chat(s, proxy, "stall:30000@1")) for _ in range(3)]
            try:
                for _ in range(150):
                    async with s.get(admin + "/llmtop/v1/health") as r:
                        health = await r.json()
                    if health["in_flight"] == 3:
                        break
                    await asyncio.sleep(0.1)
                assert health["in_flight"] == 3, health
            finally:
                proc.send_signal(signal.SIGTERM)
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
                await asyncio.gather(*held, return_exceptions=True)
    text = out.decode()
    assert proc.returncode == 0, text
    with RecordingReader(path) as rd:
        recs = [e for e in rd if isinstance(e, RequestRecord)]
        assert rd.footer is not None and rd.footer["open_at_stop"] == 0
    assert sorted(r.outcome for r in recs) == ["cancelled"] * 3
    assert f"llmtop: recording {path}: 3 requests\n" in text, text
