"""A recording given as ``-`` (standard input), a FIFO or ``<(command)``: ``report`` reads
its file more than once and ``replay`` seeks, so they read a copy (llmtop/recording/spool.py);
``export`` reads a pipe as it comes. Before, ``report <(cat r)`` said "empty file" (the header
check had read the pipe), ``report FIFO`` hung on its second open, and ``-`` was "no such
file"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.recording.spool import needs_copy

LLMTOP = [sys.executable, "-m", "llmtop"]


def _recording(tmp_path: Path) -> Path:
    rec = tmp_path / "r.jsonl"
    write_recording(rec, session(30, duration_s=5))
    return rec


def _feed_fifo(fifo: Path, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(fifo, "wb") as w:
            w.write(data)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def _report_json(*args: str, stdin: bytes | None = None) -> dict:  # type: ignore[type-arg]
    p = subprocess.run([*LLMTOP, "report", *args, "--format", "json", "-q"], input=stdin,
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def _without_source(report: dict) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in report.items() if k != "source"}


def test_report_of_standard_input_is_the_files_report(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    direct = _report_json(str(rec))
    piped = _report_json("-", stdin=rec.read_bytes())
    assert direct["outcomes"]["requests"] == 30
    assert _without_source(piped) == _without_source(direct)
    assert piped["source"]["path"] == "standard input"


def test_report_of_a_fifo_reads_it_once_and_does_not_hang(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    writer = _feed_fifo(fifo, rec.read_bytes())
    piped = _report_json(str(fifo))
    writer.join(10)
    assert _without_source(piped) == _without_source(_report_json(str(rec)))
    assert piped["source"]["file"] == "live.jsonl"
    assert not any(p.name.startswith("llmtop-") for p in tmp_path.iterdir())


def test_two_pipes_compared(tmp_path: Path) -> None:
    """``report <(…) <(…)``: both copies are made before either is analysed."""
    rec = _recording(tmp_path)
    fifos = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for f in fifos:
        os.mkfifo(f)
    writers = [_feed_fifo(f, rec.read_bytes()) for f in fifos]
    p = subprocess.run([*LLMTOP, "report", *map(str, fifos), "-q"], capture_output=True,
                       text=True, timeout=60)
    for w in writers:
        w.join(10)
    assert p.returncode == 0, p.stderr
    assert "a.jsonl" in p.stdout and "b.jsonl" in p.stdout


@pytest.mark.parametrize(("data", "said"), [
    (b"", "standard input: empty file, not an llmtop recording"),
    (b"hello\n", "standard input: not an llmtop recording (the first line is not JSON)"),
])
def test_a_bad_standard_input_is_one_line_naming_it(data: bytes, said: str) -> None:
    p = subprocess.run([*LLMTOP, "report", "-"], input=data, capture_output=True, timeout=60)
    err = p.stderr.decode()
    assert p.returncode == 2 and err.strip().splitlines() == [f"llmtop report: error: {said}"]
    assert "/tmp" not in err  # the copy's name is never shown


@pytest.mark.parametrize("command", [["report"], ["replay"], ["export", "--hlog", "-"]])
def test_a_device_is_refused_before_it_is_read(command: list[str]) -> None:
    """``/dev/zero`` was copied (report, replay) or read (export) until the disk was full
    (83 GB here) or forever; as standard input too. One line, exit 2, at once."""
    name, *rest = command
    p = subprocess.run([*LLMTOP, name, "/dev/zero", *rest], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-500:]
    assert p.stderr.strip().splitlines() == [
        f"llmtop {name}: error: /dev/zero: is a device, not a recording"]
    if name != "replay":  # (replay refuses standard input: it reads its keys there)
        with open("/dev/zero", "rb") as zero:
            p = subprocess.run([*LLMTOP, name, "-", *rest], stdin=zero, capture_output=True,
                               text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [
            f"llmtop {name}: error: standard input: is a device, not a recording"], p.stderr


def test_standard_input_from_the_terminal_is_refused() -> None:
    """``report -`` with nothing piped in waited, silently, for a recording to be typed."""
    import pty

    leader, follower = pty.openpty()
    try:
        p = subprocess.run([*LLMTOP, "report", "-"], stdin=follower, capture_output=True,
                           text=True, timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "llmtop report: error: standard input is a terminal: pipe a recording into it "
        "(… - < FILE) or name the file"]


def test_export_reads_standard_input(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    direct = subprocess.run([*LLMTOP, "export", str(rec), "--hlog", "-"], capture_output=True,
                            timeout=60)
    piped = subprocess.run([*LLMTOP, "export", "-", "--hlog", "-"], input=rec.read_bytes(),
                           capture_output=True, timeout=60)
    assert direct.returncode == piped.returncode == 0, piped.stderr.decode()
    first, _, rest = piped.stdout.partition(b"\n")
    assert first.startswith(b"#[llmtop recording standard input: ")
    assert rest == direct.stdout.partition(b"\n")[2] and b"Tag=ttft" in rest


def test_replay_refuses_standard_input_and_reads_a_pipe(tmp_path: Path) -> None:
    p = subprocess.run([*LLMTOP, "replay", "-"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "replay reads its keys from standard input" in p.stderr
    rec = _recording(tmp_path)
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    writer = _feed_fifo(fifo, rec.read_bytes())
    p = subprocess.run([*LLMTOP, "replay", str(fifo)], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    writer.join(10)
    # without a terminal the TUI is refused: but only after the recording was read whole
    # (a bad recording is told first), so the pipe was copied and its header found
    assert p.returncode == 2 and "the TUI needs a terminal" in p.stderr, p.stderr


def test_sigterm_while_copying_a_pipe_leaves_no_copy(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    fifo = tmp_path / "slow.jsonl"
    os.mkfifo(fifo)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([*LLMTOP, "report", str(fifo)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    with open(fifo, "wb") as w:
        w.write(rec.read_bytes()[:200])  # the copy has begun; the writer has not finished
        w.flush()
        deadline = time.monotonic() + 30
        while not any(p.name.startswith("llmtop-") for p in tmp_path.iterdir()):
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        with p:
            _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM
    assert "interrupted; no report written" in err and "Traceback" not in err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl", "slow.jsonl"]


def test_needs_copy(tmp_path: Path) -> None:
    rec = _recording(tmp_path)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert needs_copy("-") and needs_copy(str(fifo)) and needs_copy("/dev/null")
    assert not needs_copy(str(rec)) and not needs_copy(str(tmp_path / "missing"))
    assert not needs_copy(str(tmp_path))  # (the reader says "is a directory")


COPY_UNDER_A_SIGNAL_TAKEN_ELSEWHERE = r"""
import os, signal, sys, threading, time
from llmtop.recording.spool import rereadable

def unwind(signum, frame):
    raise SystemExit(7)

signal.signal(signal.SIGTERM, unwind)
fifo = sys.argv[1]

def writer():  # opens the FIFO, writes a little, then holds it open and silent
    with open(fifo, "wb") as w:
        w.write(b'{"type": "header"}\n')
        w.flush()
        time.sleep(60)

def taker():  # SIGTERM delivered to this thread, not the main one (as to numpy's BLAS workers)
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(60)

threading.Thread(target=writer, daemon=True).start()
threading.Thread(target=taker, daemon=True).start()
with rereadable(fifo):
    pass
"""


def test_a_signal_another_thread_takes_still_ends_the_copy_of_a_silent_pipe(
        tmp_path: Path) -> None:
    """CI saw ``report FIFO`` hang for good after its SIGTERM: the signal went to another
    thread of the process (numpy's BLAS worker), and the main thread's read of a pipe that
    stayed open and silent never returned to act on it. The copy now waits with ``select``
    and acts on it within ``WAKE_S`` (before: this blocked until the timeout)."""
    fifo = tmp_path / "silent.jsonl"
    os.mkfifo(fifo)
    p = subprocess.run([sys.executable, "-c", COPY_UNDER_A_SIGNAL_TAKEN_ELSEWHERE, str(fifo)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 7, p.stderr
