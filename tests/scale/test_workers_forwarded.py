"""``trusted_proxies`` reaches every proxy process: with ``--workers 2`` and with
``--split-observers`` a balancer's forwarded client names the user as with one process."""

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


@pytest.mark.parametrize("how", [("--workers", "2"), ("--split-observers",)])
async def test_every_worker_names_the_forwarded_client(tmp_path: Path,
                                                       how: tuple[str, ...]) -> None:
    config = tmp_path / "llmtop.toml"
    config.write_text('trusted_proxies = ["127.0.0.1"]\n')
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
