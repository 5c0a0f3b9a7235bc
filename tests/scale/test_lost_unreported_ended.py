"""A worker SIGKILLed within half a second of requests it opened and finished: their
records were still in its buffer (it reports to the coordinator every 0.5 s), and they
were lost from every count in silence. Found by a helper, 3 of 3: six sequential requests
all succeeded for the client, both workers were killed, and the snapshot read 1 request,
0 errors, no warning. Each worker process now keeps a running total of the requests it
opened in the shared table (:mod:`llmtop.fleet_counts`); at its death the coordinator
subtracts the records it took from it and the requests its last report had open, counts
the rest as failed requests (their outcome unknown), raises ``EVENTS_LOST`` and says so on
the worker's exit line. End to end: ``llmtop run --workers 2``, real processes and
sockets, the simulator upstream."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
from test_workers import chat, start_run

from llmtop.sim.server import running_sim

ROUNDS = 3
"""Rounds tried until one kills a worker with records unreported (a report can land in the
few milliseconds between the last answer and the kill: then every record arrived)."""


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


async def system(s: aiohttp.ClientSession, admin: str) -> dict[str, Any]:
    async with s.get(admin + "/llmtop/v1/snapshot?window=all&histograms=0") as r:
        snap: dict[str, Any] = await r.json()
    return snap


async def test_requests_finished_since_the_last_report_are_counted_when_killed() -> None:
    async with running_sim("tiny") as sim:
        proc, proxy, admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--workers", "2", "--gpu-source", "none")
        assert proc.stdout is not None
        lines: list[str] = []

        async def said(what: str, n: int) -> None:
            while sum(what in line for line in lines) < n:
                line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()  # type: ignore[union-attr]
                assert line, "the coordinator exited"
                lines.append(line)

        try:
            served = 0
            snap: dict[str, Any] = {}
            for rnd in range(1, ROUNDS + 1):
                # one keep-alive connection: the six go to one worker, one after another
                conn = aiohttp.TCPConnector(limit=1)
                async with aiohttp.ClientSession(connector=conn) as c:
                    answers = [await chat(c, proxy) for _ in range(6)]
                    pids = worker_pids(proc.pid)
                    for pid in pids:  # at once: within the worker's 0.5 s between reports
                        os.kill(pid, signal.SIGKILL)
                assert all(b"[DONE]" in a for a in answers)  # the client had all six
                assert len(pids) == 2, pids
                served += 6
                await said("restarted", 2 * rnd)
                async with aiohttp.ClientSession() as s:
                    for _ in range(100):  # the snapshot follows the events (0.5 s ticks)
                        snap = await system(s, admin)
                        if snap["system"]["requests"] >= served:
                            break
                        await asyncio.sleep(0.1)
                    await asyncio.sleep(1.0)  # nothing more comes (no request counted twice)
                    snap = await system(s, admin)
                sysrow = snap["system"]
                # every request the client had is counted once: as it ended, or as lost
                assert sysrow["requests"] == served, (sysrow, lines)
                assert sysrow["ok"] + sysrow["errors"] == served, sysrow
                if sysrow["errors"]:
                    break
            lost = sysrow["errors"]
            assert lost > 0, f"a report landed before each of {ROUNDS} kills: {lines}"
            warnings = {w["code"]: w["message"] for w in snap["warnings"]}
            assert "EVENTS_LOST" in warnings, snap["warnings"]
            assert warnings["EVENTS_LOST"].startswith(f"{lost} events"), warnings
            assert "ended in a killed worker before it reported them" in warnings["EVENTS_LOST"]
            exits = [line for line in lines if "exited (killed by SIGKILL)" in line]
            told = [line for line in exits if "it opened and ended after its last report" in line]
            assert told, exits
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert f"llmtop: served {served} requests".encode() in out, out
        assert f"{lost} error".encode() in out, out
