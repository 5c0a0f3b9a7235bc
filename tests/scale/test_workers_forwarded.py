"""``trusted_proxies`` reaches every proxy process: with ``--workers 2`` and with
``--split-observers`` a balancer's forwarded client names the user as with one process,
whether the config file or ``--trusted-proxies`` lists it (a worker loads the file and the
environment itself; what the command line set, the coordinator hands on)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_workers import start_run

from llmtop.sim.server import running_sim


@pytest.mark.parametrize("listed", ["file", "flag"])
@pytest.mark.parametrize("how", [("--workers", "2"), ("--split-observers",)])
async def test_every_worker_names_the_forwarded_client(tmp_path: Path, how: tuple[str, ...],
                                                       listed: str) -> None:
    config = tmp_path / "llmtop.toml"
    if listed == "file":
        config.write_text('trusted_proxies = ["127.0.0.1"]\n')
    else:  # the file lists another balancer: the flag's list is the one that holds
        config.write_text('trusted_proxies = ["10.0.0.0/8"]\n')
        how = (*how, "--trusted-proxies", "127.0.0.1")
    body = json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                       "messages": [{"role": "user", "content": "hello"}]})
    async with running_sim("tiny", max_num_seqs=16) as sim:
        proc, proxy, admin = await start_run(
            "--config", str(config), "--upstream", sim.url, "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0", "--gpu-source", "none", *how)
        try:
            # a new connection per request, so the kernel spreads them over the workers
            conn = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(i: int) -> bytes:
                    headers = {"Content-Type": "application/json",
                               "X-Forwarded-For": f"203.0.113.{i % 2 + 1}, 127.0.0.1"}
                    async with s.post(proxy + "/v1/chat/completions", data=body,
                                      headers=headers) as r:
                        return await r.read()

                bodies = await asyncio.gather(*(one(i) for i in range(20)))
                assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
                snap: dict[str, Any] = {}
                for _ in range(100):  # the workers ship their records every 0.5 s
                    async with s.get(admin + "/llmtop/v1/snapshot?window=all") as r:
                        snap = await r.json()
                    if snap["system"]["requests"] >= 20:
                        break
                    await asyncio.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert {u["user"]: u["requests"] for u in snap["users"]} == {
        "203.0.113.1": 10, "203.0.113.2": 10}


@pytest.mark.parametrize(("toml", "flags"), [
    ("[recording]\nkeep = 24\n", ("--rotate-s", "3600")),
    ('admin = "0.0.0.0:0"\n', ()),  # (--admin 127.0.0.1:0 below, as every test here)
])
async def test_a_file_value_a_flag_overrides_does_not_stop_the_workers(
        tmp_path: Path, toml: str, flags: tuple[str, ...]) -> None:
    """The file's ``keep`` with ``--rotate-s`` on the command line (the file's admin beyond
    loopback with ``--admin`` on loopback) is a good config; a worker that loaded the file
    alone refused it ("recording.keep needs rotation", "admin ... is not loopback") and
    ``run --workers 2`` exited 2 at start."""
    config = tmp_path / "llmtop.toml"
    config.write_text(toml)
    async with running_sim("tiny") as sim:
        proc, proxy, _ = await start_run(
            "--config", str(config), "--upstream", sim.url, "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0", "--gpu-source", "none", "--workers", "2", *flags)
        try:
            async with aiohttp.ClientSession() as s:
                body = json.dumps({"model": "m", "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]})
                async with s.post(proxy + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200, await r.text()
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert b"did not start" not in out and b"Traceback" not in out, out.decode()
