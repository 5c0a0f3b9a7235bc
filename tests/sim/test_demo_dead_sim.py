"""``llmtop demo`` notices one of its processes dying. When the simulator died the proxy
answered 502 to every request and the demo carried on, silently, until Ctrl-C; now it
stops the others and exits 1 with one line saying which died and how."""

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

import pytest
from proc_support import children, descendants

ADMIN_LINE = "llmtop: admin listening on "


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie no longer does)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _child_running(pid: int, command: str) -> int:
    """The child of ``pid`` that runs ``llmtop COMMAND``."""
    for child in children(pid):
        argv = _cmdline(child)
        if "llmtop" in argv and argv[argv.index("llmtop") + 1:][:1] == [command]:
            return child
    raise AssertionError(f"no 'llmtop {command}' among {[_cmdline(c) for c in children(pid)]}")


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _until_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(("command", "name"), [("sim", "the simulator"),
                                               ("run", "the proxy")])
def test_headless_demo_stops_when_one_of_its_processes_dies(
        tmp_path: Path, command: str, name: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtop", "demo", "--headless", "--record", "",
         "--peak", "2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    family: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the demo prints the admin address once all three run
            if line.startswith(ADMIN_LINE):
                break
        else:
            raise AssertionError(f"the demo never started: {proc.stderr and proc.stderr.read()}")
        family = descendants(proc.pid)
        assert len(family) >= 3, [_cmdline(p) for p in family]
        victim = _child_running(proc.pid, command)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            _kill_all([*descendants(proc.pid), proc.pid])
            proc.wait()
        _kill_all(_until_gone(family, 0))
    assert proc.returncode == 1, (out, err)
    assert err.strip().splitlines() == [
        f"llmtop demo: {name} exited (killed by SIGKILL); stopped "
        + " and ".join(n for n in ("the simulator", "the proxy", "the traffic driver")
                       if n != name)], err
    assert "Traceback" not in out + err
    assert took < 30, took
    # every process it started (and theirs) has stopped, none was left to init
    assert _until_gone(family) == [], [_cmdline(p) for p in family]


def test_demo_in_a_terminal_ends_its_tui_when_the_simulator_dies(tmp_path: Path) -> None:
    """The default (TUI) mode: the TUI ends as on Ctrl-C, and the line comes after it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "36"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmtop", "demo", "--record", "", "--peak", "2"],
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
        while len(children(proc.pid)) < 3 or b"users" not in out:  # the TUI is drawn
            assert time.monotonic() < deadline and proc.poll() is None, bytes(out)[-2000:]
            read()
            time.sleep(0.2)
        family = descendants(proc.pid)
        os.kill(_child_running(proc.pid, "sim"), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            read()
            time.sleep(0.1)
        assert proc.poll() == 1, bytes(out)[-2000:]
        time.sleep(0.2)
        read()
    finally:
        if proc.poll() is None:
            _kill_all([*descendants(proc.pid), proc.pid])
            proc.wait()
        _kill_all(_until_gone(family, 0))
        os.close(master)
    text = bytes(out).decode(errors="replace")
    assert "llmtop demo: the simulator exited (killed by SIGKILL)" in text, text[-2000:]
    assert "Traceback" not in text, text[-4000:]
    assert _until_gone(family) == [], [_cmdline(p) for p in family]
