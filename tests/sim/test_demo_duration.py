"""``llmtop demo --duration S`` stops after S seconds with its TUI too, not only headless:
in a terminal the option was never read, and the demo ran until ``q`` or Ctrl-C."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from proc_support import descendants


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_duration_ends_the_demo_under_its_tui(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "36"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtop", "demo", "--record", "demo.jsonl", "--peak", "2",
         "--duration", "4"],
        cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env,
        start_new_session=True)
    os.close(slave)
    os.set_blocking(master, False)
    out = bytearray()

    def read() -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(master, 65536):
                out.extend(chunk)

    family: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while b"users" not in out:  # the TUI is drawn
            assert time.monotonic() < deadline and proc.poll() is None, bytes(out)[-2000:]
            read()
            time.sleep(0.1)
        family = descendants(proc.pid)
        # 4 s of demo, then its three processes stop (each within a few seconds)
        deadline = time.monotonic() + 40
        while proc.poll() is None and time.monotonic() < deadline:
            read()
            time.sleep(0.1)
        code = proc.poll()
        read()
    finally:
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    text = bytes(out).decode(errors="replace")
    assert code == 0, text[-2000:]
    assert "Traceback" not in text, text[-4000:]
    assert "llmtop: recording demo.jsonl:" in text, text[-2000:]  # the summary, after the TUI
    assert [p for p in family if _alive(p)] == []
