"""Every worker of ``llmtop run --workers N`` left stopped (each exited or failed to start
MAX_RESTARTS times): the coordinator stops, exit code 1 (a runtime failure), with a line
that says why. Before, it ran on for good with nothing on the port — connections refused,
the admin API up and the process alive, so a service manager never restarted it — and
exited 0 at the next signal."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest
from test_workers import start_run, worker_pids

from llmtop.sim.server import running_sim


@pytest.mark.slow
async def test_no_worker_left_stops_the_coordinator() -> None:
    async with running_sim("tiny") as sim:
        proc, proxy, _admin = await start_run(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--split-observers", "--gpu-source", "none")
        port = int(proxy.rsplit(":", 1)[1])
        squatter = socket.socket()  # takes the port once the worker is gone (no reuse)
        try:
            pids = worker_pids(proc.pid)
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
            for _ in range(200):
                try:
                    squatter.bind(("127.0.0.1", port))
                    break
                except OSError:  # the dead worker's socket not closed yet
                    await asyncio.sleep(0.01)
            squatter.listen()
            # the exit and 5 failed starts, 0.5 s doubling between them: about 16 s and
            # the starts' own time
            out, _ = await asyncio.wait_for(proc.communicate(), 90)
        finally:
            squatter.close()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = out.decode()
    assert proc.returncode == 1, text
    assert "no worker left serving" in text, text
    assert "Address already in use" in text, text
    assert "llmtop: served 0 requests" in text, text  # the summary, as on a signal
