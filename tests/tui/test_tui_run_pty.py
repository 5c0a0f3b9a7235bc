"""`llmtop run --upstream <sim>` as a user runs it: in a pseudo-terminal, under load, the
screen shows non-zero tokens/s and the users sending traffic; `q` quits and stops the proxy
it started."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket

import aiohttp
import pytest
from proc_support import children
from pty_support import llmtop_run_in_pty

from llmtop.sim.server import running_sim

OUT_TPS = re.compile(rb"out ([0-9][0-9,]*(?:\.[0-9]+)?) tok/s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_run_under_load_in_a_pty_shows_tps_and_users() -> None:
    async with running_sim("tiny") as sim:
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        run = await llmtop_run_in_pty(sim.url, f"127.0.0.1:{port}", 140, 40)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        async def traffic(user: str) -> None:
            body = json.dumps({"model": "m", "max_tokens": 24, "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]})
            async with aiohttp.ClientSession() as s:
                while not stop.is_set():
                    try:
                        async with s.post(proxy + "/v1/chat/completions", data=body,
                                          headers={"Content-Type": "application/json",
                                                   "X-LLMTOP-User": user}) as r:
                            await r.read()
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.2)  # the proxy is still starting

        load = [asyncio.create_task(traffic(u)) for u in ("alice", "bob", "alice")]
        try:
            deadline = loop.time() + 60
            while True:
                plain = run.screen()
                tps = [float(m.replace(b",", b"")) for m in OUT_TPS.findall(plain)]
                if b"alice" in plain and b"bob" in plain and any(v > 0 for v in tps):
                    break
                assert loop.time() < deadline, f"screen never showed load: {plain[-3000:]!r}"
                await asyncio.sleep(0.5)
            # the header names the address clients use (QA: it was only in the logs)
            assert f"proxy {proxy}".encode() in plain
            stop.set()
            run.press(b"q")
            assert await asyncio.wait_for(run.proc.wait(), 60) == 0
            # the proxy child went with the TUI
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0
        finally:
            stop.set()
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            await run.close()


async def test_ctrl_c_quits_like_q_and_a_dead_proxy_ends_the_tui() -> None:
    """QA in a real pty: Ctrl-C only showed Textual's "press ctrl+q" toast; and when the
    proxy child died, the TUI said DISCONNECTED for ever and exited 0 on q."""
    async with running_sim("tiny") as sim:
        run = await llmtop_run_in_pty(sim.url)
        try:
            # --listen :0: the port the proxy got is on the screen, and nowhere else a
            # user of the TUI could see it
            m = re.search(rb"proxy http://127\.0\.0\.1:([0-9]+)", run.screen())
            assert m is not None and int(m[1]) > 0, run.screen()[:3000]
            assert await run.press_until_exit(b"\x03") == 0
            # the summary after the TUI (the pty's last bytes may come a moment after exit)
            await run.until_written(b"llmtop: served")
        finally:
            await run.close()

        run = await llmtop_run_in_pty(sim.url)
        try:
            (child,) = children(run.proc.pid)
            os.kill(child, 9)
            assert await asyncio.wait_for(run.proc.wait(), 30) == 1
            await run.until_written(b"the proxy exited (killed by SIGKILL)")
        finally:
            await run.close()


async def test_the_tuis_proxy_takes_trusted_proxies_from_the_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --trusted-proxies 127.0.0.1`` with the TUI: its headless child gets the flag
    (the TUI passes its arguments on), so a request a balancer at 127.0.0.1 forwards for
    203.0.113.9 is that user on the screen (without the flag: 127.0.0.1)."""
    monkeypatch.delenv("LLMTOP_TRUSTED_PROXIES", raising=False)
    async with running_sim("tiny") as sim:
        port = free_port()
        run = await llmtop_run_in_pty(sim.url, f"127.0.0.1:{port}",
                                      extra=("--trusted-proxies", "127.0.0.1"))
        try:
            body = json.dumps({"model": "m", "max_tokens": 4,
                               "messages": [{"role": "user", "content": "hi"}]})
            async with aiohttp.ClientSession() as s, s.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                    headers={"Content-Type": "application/json",
                             "X-Forwarded-For": "203.0.113.9"}) as r:
                assert r.status == 200, await r.text()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while b"203.0.113.9" not in (plain := run.screen()):
                assert loop.time() < deadline, plain[-3000:]
                await asyncio.sleep(0.2)
            assert await run.press_until_exit(b"q") == 0
        finally:
            await run.close()
