"""`llmtop run --upstream <sim>` as a user runs it: in a pseudo-terminal, under load, the
screen shows non-zero tokens/s and the users sending traffic; `q` quits and stops the proxy
it started."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import socket
import struct
import sys
import termios

import aiohttp
import pytest
from proc_support import children

from llmtop.sim.server import running_sim

ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1bP.*?\x1b\\",
                  re.S)
OUT_TPS = re.compile(rb"out ([0-9][0-9,]*(?:\.[0-9]+)?) tok/s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _run_in_pty(upstream: str, listen: str = "127.0.0.1:0", cols: int = 120,
                     rows: int = 36, extra: tuple[str, ...] = (),
                     ) -> tuple[asyncio.subprocess.Process, int, bytearray]:
    """``llmtop run`` (and ``extra``) in a pseudo-terminal of ``cols`` × ``rows``, once its
    TUI is drawn: the process, the pty's master side and everything the TUI wrote (kept
    growing)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "run", "--upstream", upstream, "--listen", listen,
        "--admin", "127.0.0.1:0", "--refresh-hz", "4", "--gpu-source", "none", *extra,
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            out.extend(os.read(master, 65536))
        except OSError:
            loop.remove_reader(master)

    loop.add_reader(master, readable)
    deadline = loop.time() + 60
    try:
        while b"users" not in ANSI.sub(b"", bytes(out)):  # the TUI is drawn
            assert loop.time() < deadline, bytes(out)[-2000:]
            await asyncio.sleep(0.2)
    except BaseException:  # never leave it (and its proxy) running
        await _close(proc, master)
        raise
    return proc, master, out


async def _close(proc: asyncio.subprocess.Process, master: int) -> None:
    """Stop reading the pty; kill ``llmtop run`` and its proxy if they still run."""
    asyncio.get_running_loop().remove_reader(master)
    os.close(master)
    if proc.returncode is None:
        for pid in [*children(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        await proc.wait()


async def press_until_exit(proc: asyncio.subprocess.Process, master: int, key: bytes) -> int:
    """Press ``key`` (again every 2 s, should the first come before the app reads input)
    until the process exits; its exit code (None if it never did)."""
    for _ in range(15):
        os.write(master, key)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 2)
            break
    return proc.returncode  # type: ignore[return-value]


async def _until_written(out: bytearray, text: bytes, within_s: float = 5.0) -> None:
    """Wait until the pty has carried ``text``; fail with what it did carry."""
    for _ in range(int(within_s / 0.05)):
        if text in bytes(out):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never written: {bytes(out)[-2000:]!r}")


async def test_run_under_load_in_a_pty_shows_tps_and_users() -> None:
    async with running_sim("tiny") as sim:
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        proc, master, out = await _run_in_pty(sim.url, f"127.0.0.1:{port}", 140, 40)
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
                plain = ANSI.sub(b"", bytes(out))
                tps = [float(m.replace(b",", b"")) for m in OUT_TPS.findall(plain)]
                if b"alice" in plain and b"bob" in plain and any(v > 0 for v in tps):
                    break
                assert loop.time() < deadline, f"screen never showed load: {plain[-3000:]!r}"
                await asyncio.sleep(0.5)
            # the header names the address clients use (QA: it was only in the logs)
            assert f"proxy {proxy}".encode() in plain
            stop.set()
            os.write(master, b"q")
            assert await asyncio.wait_for(proc.wait(), 60) == 0
            # the proxy child went with the TUI
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0
        finally:
            stop.set()
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            await _close(proc, master)


async def test_ctrl_c_quits_like_q_and_a_dead_proxy_ends_the_tui() -> None:
    """QA in a real pty: Ctrl-C only showed Textual's "press ctrl+q" toast; and when the
    proxy child died, the TUI said DISCONNECTED for ever and exited 0 on q."""
    async with running_sim("tiny") as sim:
        proc, master, out = await _run_in_pty(sim.url)
        try:
            # --listen :0: the port the proxy got is on the screen, and nowhere else a
            # user of the TUI could see it
            m = re.search(rb"proxy http://127\.0\.0\.1:([0-9]+)", ANSI.sub(b"", bytes(out)))
            assert m is not None and int(m[1]) > 0, ANSI.sub(b"", bytes(out))[:3000]
            assert await press_until_exit(proc, master, b"\x03") == 0
            # the summary after the TUI (the pty's last bytes may come a moment after exit)
            await _until_written(out, b"llmtop: served")
        finally:
            await _close(proc, master)

        proc, master, out = await _run_in_pty(sim.url)
        try:
            (child,) = children(proc.pid)
            os.kill(child, 9)
            assert await asyncio.wait_for(proc.wait(), 30) == 1
            await _until_written(out, b"the proxy exited (killed by SIGKILL)")
        finally:
            await _close(proc, master)


async def test_the_tuis_proxy_takes_trusted_proxies_from_the_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --trusted-proxies 127.0.0.1`` with the TUI: its headless child gets the flag
    (the TUI passes its arguments on), so a request a balancer at 127.0.0.1 forwards for
    203.0.113.9 is that user on the screen (without the flag: 127.0.0.1)."""
    monkeypatch.delenv("LLMTOP_TRUSTED_PROXIES", raising=False)
    async with running_sim("tiny") as sim:
        port = free_port()
        proc, master, out = await _run_in_pty(sim.url, f"127.0.0.1:{port}",
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
            while b"203.0.113.9" not in (plain := ANSI.sub(b"", bytes(out))):
                assert loop.time() < deadline, plain[-3000:]
                await asyncio.sleep(0.2)
            assert await press_until_exit(proc, master, b"q") == 0
        finally:
            await _close(proc, master)
