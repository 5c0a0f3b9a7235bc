"""Crash safety and graceful shutdown of ``llmtop run --headless`` under load.

The simulator and the proxy run as subprocesses (soak_driver.start_sim / start_proxy);
the clients run here. ``kill -9`` must leave a recording that llmtop's own reader reads
back, missing at most the last second; SIGTERM must let streams finish within
``timeouts.shutdown_grace_s``, cancel the rest (recorded ``cancelled``) and exit 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from soak_driver import chat_body, read_request_records, start_proxy, start_sim

from llmtop.recording.reader import RecordingReader


async def _stream(s: aiohttp.ClientSession, url: str, user: str, max_tokens: int,
                  started: asyncio.Event | None = None) -> tuple[str, bytes, float]:
    """One streaming chat: (result, body, wall-clock end). result is ok, truncated or
    the client error's name."""
    body = b""
    try:
        async with s.post(url + "/v1/chat/completions", data=chat_body(max_tokens),
                          headers={"X-LLMTOP-User": user,
                                   "Content-Type": "application/json"}) as r:
            if r.status != 200:
                return f"HTTP {r.status}", body, time.time()
            async for data in r.content.iter_any():
                body += data
                if started is not None and b"content" in body:
                    started.set()
        ok = body.rstrip().endswith(b"data: [DONE]")
        return ("ok" if ok else "truncated"), body, time.time()
    except (aiohttp.ClientError, OSError) as exc:
        return type(exc).__name__, body, time.time()


async def test_kill_9_under_load_leaves_a_readable_recording(tmp_path: Path) -> None:
    sim, sim_url, _ = start_sim(tmp_path, step_s=0.1)
    record = tmp_path / "crash.jsonl"
    proxy, purl, _, _ = start_proxy(tmp_path, sim_url, record)
    done: dict[str, tuple[str, float]] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            stop = asyncio.Event()

            async def worker(w: int) -> None:
                n = 0
                while not stop.is_set():
                    user = f"crash-{w}-{n}"
                    n += 1
                    res, _, end = await _stream(s, purl, user, 5)
                    done[user] = (res, end)

            tasks = [asyncio.create_task(worker(w)) for w in range(100)]
            await asyncio.sleep(6.0)
            t_kill = time.time()
            proxy.send_signal(signal.SIGKILL)
            proxy.wait(10)
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        if proxy.poll() is None:
            proxy.kill()
    try:
        with RecordingReader(record) as reader:
            events = list(reader)
            summary = reader.summary()
        assert reader.header["format"] == "llmtop-recording"
        assert not summary["complete"] and summary["bad_lines"] == 0
        assert summary["truncated_lines"] <= 1
        records, _ = read_request_records(record)
        users = [r["user"] for r in records]
        assert len(users) == len(set(users)) == len(events) - sum(
            1 for e in events if type(e).__name__ != "RequestRecord")
        ok_before = {u for u, (res, end) in done.items() if res == "ok" and end < t_kill - 1.0}
        missing = ok_before - set(users)
        print(f"kill -9: {len(done)} requests, {len(ok_before)} finished >1 s before the kill, "
              f"{len(records)} records read back, {len(missing)} of those missing")
        assert len(ok_before) > 200
        assert not missing, sorted(missing)[:10]
        for r in records:  # nothing from after the kill, no duplicates, all outcomes known
            assert r["t_start"] + r["e2e_s"] <= t_kill + 0.5
            assert r["outcome"] in ("ok", "cancelled", "error", "timeout")

        # restart: the crashed file is never overwritten; a new file works
        again = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sim_url,
             "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", str(record)],
            capture_output=True, text=True, timeout=60)
        assert again.returncode == 2, again
        assert "file exists" in again.stderr and "Traceback" not in again.stderr
        assert "listening" not in again.stdout  # refused before saying it serves
        assert len(again.stderr.strip().splitlines()) == 1
        before = record.stat().st_size
        record2 = tmp_path / "after-crash.jsonl"
        proxy2, purl2, _, _ = start_proxy(tmp_path, sim_url, record2, name="llmtop2")
        try:
            async with aiohttp.ClientSession() as s:
                results = await asyncio.gather(*[_stream(s, purl2, f"after-{i}", 3)
                                                 for i in range(20)])
            assert all(r[0] == "ok" for r in results)
            proxy2.send_signal(signal.SIGTERM)
            assert proxy2.wait(30) == 0
        finally:
            if proxy2.poll() is None:
                proxy2.kill()
        records2, summary2 = read_request_records(record2)
        assert summary2["complete"] and len(records2) == 20
        assert record.stat().st_size == before
    finally:
        sim.kill()
        sim.wait(10)


async def test_sigterm_finishes_short_streams_cancels_long_ones_and_exits_0(
        tmp_path: Path) -> None:
    sim, sim_url, _ = start_sim(tmp_path, step_s=0.2)
    record = tmp_path / "term.jsonl"
    proxy, purl, _, logs = start_proxy(tmp_path, sim_url, record,
                                       env={"LLMTOP_TIMEOUTS_SHUTDOWN_GRACE_S": "2.5"})
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            started = [asyncio.Event() for _ in range(40)]
            # short: 6 tokens × 0.2 s ≈ 1.2 s; long: 200 tokens ≈ 40 s
            tasks = [asyncio.create_task(_stream(s, purl, f"short-{i}", 6, started[i]))
                     for i in range(20)]
            tasks += [asyncio.create_task(_stream(s, purl, f"long-{i}", 200, started[20 + i]))
                      for i in range(20)]
            async with asyncio.timeout(20):
                for ev in started:
                    await ev.wait()
            t_term = time.monotonic()
            proxy.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            try:  # no new requests once shutting down
                async with aiohttp.ClientSession() as s2, s2.get(
                        purl + "/v1/models", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    late = f"HTTP {r.status}"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                late = type(exc).__name__
            results = await asyncio.gather(*tasks)
            t_clients = time.monotonic() - t_term
        rc = await asyncio.to_thread(proxy.wait, 30)
        t_exit = time.monotonic() - t_term
    finally:
        if proxy.poll() is None:
            proxy.kill()
        sim.kill()
        sim.wait(10)
    out = "".join(p.read_text() for p in logs)
    print(f"SIGTERM: clients done after {t_clients:.2f} s, exit after {t_exit:.2f} s; "
          f"late request: {late}")
    assert rc == 0, out
    assert not late.startswith("HTTP 2"), late
    short = [r[0] for r in results[:20]]
    long_ = [r[0] for r in results[20:]]
    assert short == ["ok"] * 20
    assert all(r != "ok" for r in long_), long_
    assert 2.0 < t_clients < 6.0
    assert t_exit < 10.0
    assert "20 in-flight streams were cancelled" in out, out
    assert "Traceback" not in out
    records, summary = read_request_records(record)
    assert summary["complete"]
    by_user = {r["user"]: r for r in records}
    assert len(by_user) == 40
    for i in range(20):
        assert by_user[f"short-{i}"]["outcome"] == "ok"
        long_rec = by_user[f"long-{i}"]
        assert long_rec["outcome"] == "cancelled", long_rec
        assert long_rec["error"] == "proxy shut down"
        assert long_rec["status"] == 200 and long_rec["ttft_s"] is not None


PARENT = """
import sys, time
from llmtop.cli.common import Child, llmtop_cmd
from llmtop.cli.run import ADMIN_PREFIX, LISTEN_PREFIX
child = Child(llmtop_cmd(*sys.argv[1:]), (LISTEN_PREFIX, ADMIN_PREFIX))
print(child.proc.pid, child.found[LISTEN_PREFIX], flush=True)
time.sleep(600)
"""


def _gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` exits within ``timeout_s`` (a zombie waiting for init to reap it
    has exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


async def test_a_child_proxy_stops_cleanly_when_its_parent_is_killed(tmp_path: Path) -> None:
    """The proxy a TUI (or the demo) starts runs in a session of its own; killed with -9,
    the parent cannot stop it. The child notices within a second or two and shuts down as
    on SIGTERM: its port is released and its recording is complete."""
    sim, sim_url, _ = start_sim(tmp_path, step_s=0.01)
    record = tmp_path / "orphan.jsonl"
    child = 0
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, "run", "--headless", "--upstream", sim_url,
        "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", str(record),
        "--gpu-source", "none", stdout=asyncio.subprocess.PIPE)
    try:
        assert parent.stdout is not None
        pid_s, purl = (await asyncio.wait_for(parent.stdout.readline(), 60)).decode().split()
        child = int(pid_s)
        async with aiohttp.ClientSession() as s:
            for i in range(5):
                assert (await _stream(s, purl, f"u{i}", 4))[0] == "ok"
        parent.kill()
        await parent.wait()
        assert await asyncio.to_thread(_gone, child, 15), "the orphaned proxy still runs"
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
        if child and not _gone(child, 0):
            os.kill(child, signal.SIGKILL)  # the test failed: leave nothing running
        sim.kill()
        sim.wait(10)
    records, summary = read_request_records(record)
    assert summary["complete"] and len(records) == 5
