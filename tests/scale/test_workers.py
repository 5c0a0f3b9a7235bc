"""`llmtop run --workers N`: N processes share the port; the admin API, /metrics and the
recording see one proxy (one aggregation of every worker's events)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmtop.recording.reader import iter_recording
from llmtop.sim.server import running_sim

LISTEN = "llmtop: proxy listening on "
ADMIN = "llmtop: admin listening on "


async def start_run(*args: str) -> tuple[asyncio.subprocess.Process, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "run", "--headless", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    proxy = admin = ""
    while not (proxy and admin):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "llmtop run exited before announcing its addresses"
        if line.startswith(LISTEN):
            proxy = line[len(LISTEN):].strip()
        elif line.startswith(ADMIN):
            admin = line[len(ADMIN):].strip()
    return proc, proxy, admin


async def chat(s: aiohttp.ClientSession, proxy: str, fault: str = "") -> bytes:
    """A 4-token streamed chat completion (``fault``: the simulator's X-Sim-Fault)."""
    body = json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                       "messages": [{"role": "user", "content": "hello"}]})
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["X-Sim-Fault"] = fault
    async with s.post(proxy + "/v1/chat/completions", data=body, headers=headers) as r:
        return await r.read()


async def finished_ok(s: aiohttp.ClientSession, admin: str, n: int) -> list[dict[str, Any]]:
    """The proxy's recently finished ``ok`` requests, once there are ``n`` (workers
    forward every 0.5 s) or after 10 s."""
    rows: list[dict[str, Any]] = []
    for _ in range(100):
        async with s.get(admin + "/llmtop/v1/requests?state=recent") as r:
            rows = [x for x in await r.json() if x["outcome"] == "ok"]
        if len(rows) >= n:
            break
        await asyncio.sleep(0.1)
    return rows


async def test_two_workers_look_like_one_proxy(tmp_path: Path) -> None:
    rec = tmp_path / "w.jsonl"
    async with running_sim("tiny", max_num_seqs=16) as sim:
        proc, proxy, admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--record", str(rec), "--gpu-source", "none")
        try:
            body = json.dumps({"model": "m", "max_tokens": 8, "stream": True,
                               "messages": [{"role": "user", "content": "hello"}]})
            users = ["alice", "bob"]
            # a new connection per request, so the kernel spreads them over the workers
            conn = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(i: int) -> int:
                    async with s.post(proxy + "/v1/chat/completions", data=body, headers={
                            "Content-Type": "application/json",
                            "X-LLMTOP-User": users[i % 2]}) as r:
                        return len(await r.read())

                sizes = await asyncio.gather(*(one(i) for i in range(40)))
                assert all(n > 0 for n in sizes)
                for _ in range(100):  # workers forward every 0.5 s
                    async with s.get(admin + "/llmtop/v1/snapshot?window=all") as r:
                        snap = await r.json()
                    if snap["system"]["requests"] >= 40:
                        break
                    await asyncio.sleep(0.1)
                async with s.get(admin + "/llmtop/v1/requests?state=recent") as r:
                    recent = await r.json()
                async with s.get(admin + "/metrics") as r:
                    metrics = await r.text()
            assert snap["system"]["requests"] == 40
            assert snap["latency"]["ttft"]["count"] == 40
            assert {u["user"]: u["requests"] for u in snap["users"]} == {"alice": 20, "bob": 20}
            # request ids carry their process's prefix: both workers served traffic
            rows = recent if isinstance(recent, list) else recent.get("requests", [])
            prefixes = {str(r["id"]).split("-")[0] for r in rows}
            assert len(prefixes) == 2, prefixes
            ok = [s for f in text_string_to_metric_families(metrics)
                  for s in f.samples if s.name == "llmtop_requests_total"
                  and s.labels.get("outcome") == "ok"]
            assert ok and ok[0].value == 40
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert b"served 40 requests" in out
    records = [e for e in iter_recording(rec) if type(e).__name__ == "RequestRecord"]
    assert len(records) == 40
    assert len({r.id for r in records}) == 40  # type: ignore[union-attr]


async def test_a_record_counts_every_workers_open_requests() -> None:
    """``concurrency_at_start`` is the whole proxy's open requests: requests held open on
    both workers count for a request that starts on either (the workers share a table of
    their open requests; before, a worker knew the others' only from the coordinator's
    last report)."""
    async with running_sim("tiny", max_num_seqs=64) as sim:
        proc, proxy, admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--gpu-source", "none")
        try:
            conn = aiohttp.TCPConnector(force_close=True, limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(fault: str) -> bytes:
                    return await chat(s, proxy, fault)

                held = [asyncio.create_task(one("stall:4000@1")) for _ in range(12)]
                for _ in range(100):  # until all 12 are open (summed over the workers)
                    async with s.get(admin + "/llmtop/v1/requests?state=active") as r:
                        if len(await r.json()) == 12:
                            break
                    await asyncio.sleep(0.1)
                probes = [await one("") for _ in range(16)]  # new connections: both workers
                assert all(probes)
                rows = await finished_ok(s, admin, 16)
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
            assert len(rows) == 16
            assert len({str(r["id"]).split("-")[0] for r in rows}) == 2  # both workers
            assert {r["concurrency_at_start"] for r in rows} == {13}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()


def worker_pids(coordinator: int) -> list[int]:
    """The coordinator's child processes (its workers), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == coordinator:
            pids.append(int(stat.parent.name))
    return pids


async def test_a_worker_that_dies_is_restarted_and_forgotten(tmp_path: Path) -> None:
    """SIGKILL one of two workers while both hold requests open: the coordinator says so
    (and raises WORKER_DOWN until the new one serves), its open requests leave the active
    list, the others stop counting them in ``concurrency_at_start``, and a new worker
    serves on the same port."""
    rec = tmp_path / "w.jsonl"
    async with running_sim("tiny", max_num_seqs=64) as sim:
        proc, proxy, admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--gpu-source", "none", "--record", str(rec))
        assert proc.stdout is not None
        try:
            conn = aiohttp.TCPConnector(force_close=True, limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(fault: str = "") -> bytes:
                    return await chat(s, proxy, fault)

                async def active() -> list[dict[str, object]]:
                    async with s.get(admin + "/llmtop/v1/requests?state=active") as r:
                        rows: list[dict[str, object]] = await r.json()
                        return rows

                # each new connection's worker is the kernel's pick (SO_REUSEPORT's hash):
                # ten more until both hold some (CI once saw all of ten land on one)
                held: list[asyncio.Task[bytes]] = []
                rows: list[dict[str, object]] = []
                for _ in range(5):
                    held += [asyncio.create_task(one("stall:30000@1")) for _ in range(10)]
                    for _ in range(100):  # until all are open (workers report every 0.5 s)
                        rows = await active()
                        if len(rows) == len(held):
                            break
                        await asyncio.sleep(0.1)
                    if len({str(r["id"]).split("-")[0] for r in rows}) == 2:
                        break
                by_worker: dict[str, int] = {}
                for r in rows:
                    prefix = str(r["id"]).split("-")[0]
                    by_worker[prefix] = by_worker.get(prefix, 0) + 1
                assert len(by_worker) == 2, by_worker

                pids = worker_pids(proc.pid)
                assert len(pids) == 2, pids
                os.kill(pids[0], signal.SIGKILL)

                async def said(what: str) -> list[str]:
                    lines: list[str] = []
                    while not any(what in line for line in lines):
                        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
                        assert line, "the coordinator exited"
                        lines.append(line)
                    return lines

                exited = await said("exited")
                assert "killed by SIGKILL" in exited[-1], exited
                # before the new worker is up (0.5 s and its start-up): the dead one's
                # requests are off the active list, and not counted by the survivor
                rows = await active()
                survivors = {str(r["id"]).split("-")[0] for r in rows}
                assert len(survivors) == 1, rows
                survivor = survivors.pop()
                dead = (set(by_worker) - {survivor}).pop()
                assert len(rows) == by_worker[survivor]
                assert await one()  # the survivor alone listens now
                await said("restarted")
                assert len(worker_pids(proc.pid)) == 2  # a new one beside the survivor
                lost = sum(t.done() and t.exception() is not None for t in held)
                assert lost == by_worker[dead]  # their clients saw the connection close

                probes = [await one() for _ in range(16)]  # new connections: both workers
                assert all(probes)
                recent = await finished_ok(s, admin, 17)
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
            assert len(recent) == 17
            prefixes = {str(x["id"]).split("-")[0] for x in recent}
            assert len(prefixes) == 2 and survivor in prefixes and dead not in prefixes
            # only the survivor's held requests count: the dead worker's slot was cleared
            assert {x["concurrency_at_start"] for x in recent} == {len(rows) + 1}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
    assert b"llmtop: 1 worker restart\n" in out, out
    warnings = [e for e in iter_recording(rec) if type(e).__name__ == "WarningEvent"]
    assert [(w.code, w.state) for w in warnings] == [  # type: ignore[attr-defined]
        ("WORKER_DOWN", "raised"), ("WORKER_DOWN", "cleared")]
    assert "killed by SIGKILL" in warnings[0].message  # type: ignore[attr-defined]

