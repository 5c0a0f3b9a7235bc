"""``llmtop`` commands as a user runs them: in a pseudo-terminal of a given size, what
they write read on the test's event loop and kept (importable from any test folder:
pytest puts ``tests/`` on ``sys.path`` for its ``conftest.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import re
import struct
import sys
import termios
from dataclasses import dataclass, field

from proc_support import children

ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1bP.*?\x1b\\",
                  re.S)
"""The terminal's control sequences (what is left is the text on screen, in order)."""


@dataclass
class InPty:
    """A command running in a pseudo-terminal: the process, the pty's master side, and
    everything the command wrote (kept growing while it runs)."""

    proc: asyncio.subprocess.Process
    master: int
    out: bytearray = field(default_factory=bytearray)
    wrote: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on every read (cleared by whoever waits on it)."""

    def screen(self, start: int = 0) -> bytes:
        """What was written from byte ``start`` on, control sequences left out."""
        return ANSI.sub(b"", bytes(self.out)[start:])

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    async def until_written(self, text: bytes, within_s: float = 5.0) -> None:
        """Wait until the pty has carried ``text``; fail with what it did carry."""
        for _ in range(int(within_s / 0.05)):
            if text in bytes(self.out):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{text!r} never written: {bytes(self.out)[-2000:]!r}")

    async def until_on_screen(self, *needles: bytes, within_s: float = 60.0) -> bytes:
        """Wait until every one of ``needles`` is on screen; the screen's text then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            plain = self.screen()
            if all(n in plain for n in needles):
                return plain
            if loop.time() > deadline:
                raise AssertionError(f"not on screen: {needles!r}; got {plain[-2000:]!r}")
            self.wrote.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wrote.wait(), 1.0)

    async def press_until_exit(self, key: bytes) -> int | None:
        """Press ``key`` (again every 2 s, should the first come before the app reads
        input) until the process exits; its exit code (None if it never did)."""
        for _ in range(15):
            self.press(key)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), 2)
                break
        return self.proc.returncode

    async def close(self) -> None:
        """Stop reading the pty; kill the command and its children (``run``'s proxy) if
        they still run."""
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        if self.proc.returncode is None:
            for pid in [*children(self.proc.pid), self.proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            await self.proc.wait()


async def llmtop_in_pty(*args: str, cols: int = 120, rows: int = 36) -> InPty:
    """``python -m llmtop ARGS`` in a new session on a pseudo-terminal of ``cols`` ×
    ``rows`` (stdin, stdout and stderr), as in an xterm; its output read from now on."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", *args, stdin=slave, stdout=slave, stderr=slave,
        env=env, start_new_session=True)
    os.close(slave)
    run = InPty(proc, master)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            run.out.extend(os.read(master, 65536))
        except OSError:  # the command closed its end
            loop.remove_reader(master)
        run.wrote.set()

    loop.add_reader(master, readable)
    return run


async def llmtop_run_in_pty(upstream: str, listen: str = "127.0.0.1:0", cols: int = 120,
                            rows: int = 36, extra: tuple[str, ...] = ()) -> InPty:
    """``llmtop run`` in front of ``upstream`` (and ``extra``) in a pseudo-terminal of
    ``cols`` × ``rows``, once its TUI is drawn."""
    run = await llmtop_in_pty(
        "run", "--upstream", upstream, "--listen", listen, "--admin", "127.0.0.1:0",
        "--refresh-hz", "4", "--gpu-source", "none", *extra, cols=cols, rows=rows)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    try:
        while b"users" not in run.screen():  # the TUI is drawn
            assert loop.time() < deadline, bytes(run.out)[-2000:]
            await asyncio.sleep(0.2)
    except BaseException:  # never leave it (and its proxy) running
        await run.close()
        raise
    return run
