"""`llmtop attach` as a user runs it: a real process in a pseudo-terminal against a real
admin API, and one-line errors for bad arguments."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from tui_support import AdminServer

ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1bP.*?\x1b\\",
                  re.S)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["ftp://h:1"], "is not an admin URL"),
     (["localhost"], "needs a port"),
     (["--refresh-hz", "0", "h:1"], "--refresh-hz 0 must be in")],
)
def test_bad_arguments_exit_2_with_one_line(argv: list[str], message: str) -> None:
    """A bad URL or rate is one line on stderr and exit code 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "llmtop", "attach", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert lines[0].startswith("llmtop attach: error:")


def test_several_urls_without_merge_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Several URLs in a build without llmtop.metrics.merge: one line, exit code 2."""
    monkeypatch.setitem(sys.modules, "llmtop.metrics.merge", None)
    from llmtop.cli import main

    assert main(["attach", "h:1", "h:2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "several proxies needs llmtop.metrics.merge" in err[0]


async def test_attach_in_a_pty_shows_live_users_and_quits_on_q() -> None:
    """`llmtop attach URL` in a 120×36 pseudo-terminal draws the proxy's users and
    figures from the admin API, and `q` exits with code 0."""
    srv = AdminServer("saturated")
    await srv.start()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "36"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "attach", srv.url, "--refresh-hz", "10",
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )
    os.close(slave)
    out = bytearray()
    loop = asyncio.get_running_loop()
    got = asyncio.Event()

    def readable() -> None:
        try:
            out.extend(os.read(master, 65536))
        except OSError:
            loop.remove_reader(master)
        got.set()

    loop.add_reader(master, readable)

    async def screen_has(*needles: bytes, limit_s: float = 60.0) -> bytes:
        deadline = loop.time() + limit_s
        while True:
            plain = ANSI.sub(b"", bytes(out))
            if all(n in plain for n in needles):
                return plain
            if loop.time() > deadline:
                raise AssertionError(f"not on screen: {needles!r}; got {plain[-2000:]!r}")
            got.clear()
            try:
                await asyncio.wait_for(got.wait(), 1.0)
            except TimeoutError:
                pass

    try:
        await screen_has(b"batch-job", b"key:3f9a1c2e", b"1,453")
        assert srv.windows and srv.windows[0] == "60"
        os.write(master, b"q")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        loop.remove_reader(master)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
        await srv.stop()
