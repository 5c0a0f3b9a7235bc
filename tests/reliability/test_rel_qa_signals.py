"""Signals, terminals and pipes, as users meet them with real processes: SIGHUP (the ssh
session or terminal closed) stops ``llmtop run`` as SIGTERM does — recording footer
written, one summary, exit 0, no child left — unless ``nohup`` ignored it; a second signal
stops now without a traceback; a closed stdout does not kill a proxy; ``timeout`` on bench
says the finished levels. Traffic is real, against ``llmtop sim``; outcomes only (exit
codes, lines, file contents, /proc), with generous deadlines."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_support import children

PY = [sys.executable, "-m", "llmtop"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_all(proc: subprocess.Popen[str]) -> None:
    for pid in [*children(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@contextlib.contextmanager
def sim() -> Iterator[str]:
    """``llmtop sim`` on a free port: its URL."""
    p = subprocess.Popen([*PY, "sim", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("llmtop: sim listening on "), line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        _kill_all(p)


def _until(lines: list[str], prefix: str, stream: object, within_s: float = 60) -> str:
    """Read ``stream`` into ``lines`` until one starts with ``prefix``; that line."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return line.rstrip("\n")
    raise AssertionError(f"never said {prefix!r}: {lines}")


def _chat(proxy: str, max_tokens: int = 8) -> bytes:
    body = json.dumps({"model": "m", "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(proxy + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def _headless(upstream: str, rec: Path, *extra: str,
              preexec: object = None) -> tuple[subprocess.Popen[str], str, list[str]]:
    p = subprocess.Popen(
        [*PY, "run", "--headless", "--upstream", upstream, "--listen", "127.0.0.1:0",
         "--admin", "127.0.0.1:0", "--gpu-source", "none", "--record", str(rec), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=preexec)  # type: ignore[arg-type]
    lines: list[str] = []
    try:
        proxy = _until(lines, "llmtop: proxy listening on ", p.stdout).rsplit(" ", 1)[1]
        _until(lines, "llmtop: admin listening on ", p.stdout)
    except BaseException:
        _kill_all(p)
        raise
    return p, proxy, lines


def _complete_gzip(path: Path) -> list[dict[str, object]]:
    """The recording's lines; fails if the gzip stream was cut (no footer)."""
    with gzip.open(path, "rt") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


@pytest.mark.parametrize("workers", [0, 2])
def test_sighup_stops_headless_gracefully(tmp_path: Path, workers: int) -> None:
    """QA: SIGHUP killed ``run --headless`` at once (exit -1), the .jsonl.gz cut mid-stream
    (no gzip trailer, no footer). Now as SIGTERM: summary, exit 0, footer; with --workers 2
    the workers go too."""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        extra = ("--workers", "2") if workers else ()
        p, proxy, _ = _headless(up, rec, *extra)
        try:
            kids = children(p.pid)
            assert len(kids) >= workers
            assert b"[DONE]" in _chat(proxy)
            p.send_signal(signal.SIGHUP)
            out, err = p.communicate(timeout=60)
        finally:
            _kill_all(p)
        assert p.returncode == 0, (p.returncode, out, err)
        assert "Traceback" not in err, err
        assert "llmtop: served 1 request" in out, out
        records = _complete_gzip(rec)
        assert records and records[-1].get("type") == "footer", records[-1:]
        for k in kids:
            deadline = time.monotonic() + 30
            while _alive(k) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(k), f"child {k} left running"


def _ignore_hup() -> None:  # what nohup does before exec
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_nohup_keeps_serving_through_sighup(tmp_path: Path) -> None:
    """Started with SIGHUP ignored (``nohup``), the proxy outlives the terminal: SIGHUP
    changes nothing; SIGTERM still stops it gracefully."""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        p, proxy, _ = _headless(up, rec, preexec=_ignore_hup)
        try:
            p.send_signal(signal.SIGHUP)
            assert b"[DONE]" in _chat(proxy)  # answered after the hang-up
            assert p.poll() is None
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=60)
        finally:
            _kill_all(p)
        assert p.returncode == 0, (out, err)
        assert "llmtop: served 1 request" in out
        assert _complete_gzip(rec)[-1].get("type") == "footer"


def test_second_signal_stops_now_without_a_traceback(tmp_path: Path) -> None:
    """An impatient user signals twice while a stream is open: the first starts the
    graceful stop (the stream may finish within the grace), the second cancels what is
    still open ("stopping now"); exit 0, summary, footer, no traceback."""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        p, proxy, _ = _headless(up, rec)
        try:
            body = json.dumps({"model": "m", "max_tokens": 1500, "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            req = urllib.request.Request(proxy + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.read(1)  # the stream is open and flowing
                p.send_signal(signal.SIGINT)
                assert p.stdout is not None
                lines: list[str] = []
                _until(lines, "llmtop: stopping: 1 request(s) in flight", p.stdout)
                p.send_signal(signal.SIGTERM)
                with contextlib.suppress(Exception):
                    r.read()
            out, err = p.communicate(timeout=60)
        finally:
            _kill_all(p)
        assert p.returncode == 0, (out, err)
        assert "Traceback" not in err + out, err
        assert "llmtop: stopping now" in out + err, (out, err)
        assert "llmtop: served 1 request" in out, out
        assert _complete_gzip(rec)[-1].get("type") == "footer"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_sim_stops_on_hangup_and_after_its_reader_left(sig: signal.Signals) -> None:
    """``llmtop sim | head -1``: head leaves after the address line; sim serves on (it
    writes nothing more) and a later SIGTERM or SIGHUP (it used to kill it: exit -1)
    stops it cleanly: exit 0, no traceback."""
    r, w = os.pipe()
    p = subprocess.Popen([*PY, "sim", "--listen", "127.0.0.1:0"], stdout=w,
                         stderr=subprocess.PIPE, text=True)
    os.close(w)
    try:
        with os.fdopen(r) as head:  # head -1
            line = head.readline()
        assert line.startswith("llmtop: sim listening on "), line
        url = line.rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
            assert resp.status == 200  # still serving, its reader gone
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        _kill_all(p)
    assert p.returncode == 0, err
    assert "Traceback" not in err, err


class _Pty:
    """``llmtop run`` (its TUI) on a pseudo-terminal that is its controlling terminal, as
    under ssh: closing the master side hangs it up (the kernel's SIGHUP). What it writes
    is drained in a thread (a full pty would block the TUI)."""

    def __init__(self, upstream: str, rec: Path, *extra: str,
                 preexec_hup_ignored: bool = False, argv: list[str] | None = None) -> None:
        import fcntl
        import pty
        import struct
        import termios
        import threading

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))

        def session() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if preexec_hup_ignored:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            argv or [*PY, "run", "--upstream", upstream, "--listen", "127.0.0.1:0", "--admin",
                     "127.0.0.1:0", "--gpu-source", "none", "--refresh-hz", "4", "--record",
                     str(rec), *extra],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=session, env={**os.environ, "TERM": "xterm-256color"})
        os.close(slave)
        self.out = bytearray()
        self.closed = False
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 60
        while b"users" not in bytes(self.out):  # the TUI is drawn
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise AssertionError(bytes(self.out)[-2000:])
            time.sleep(0.2)
        self.children = children(self.proc.pid)
        if argv is None:
            (self.child,) = self.children

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.out.extend(data)

    def close_master(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.master)

    def quit(self) -> int | None:
        """Press q (again while the TUI is still starting, for up to 30 s); its exit code."""
        for _ in range(15):
            os.write(self.master, b"q")
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.proc.wait(2)
        return self.proc.returncode

    def kill(self) -> None:
        for pid in [*children(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        self.close_master()


def _gone(pid: int, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


@pytest.mark.parametrize("workers", [0, 2])
def test_sighup_to_the_tui_quits_as_q_does(tmp_path: Path, workers: int) -> None:
    """QA: SIGHUP killed the TUI at once (exit -1): the terminal left on the alternate
    screen with mouse reporting on, no summary. Now as q: the screen restored, the
    proxy's summary printed, exit 0, the proxy child (with --workers 2: the coordinator
    and its workers) gone and its recording complete."""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        t = _Pty(up, rec, *(("--workers", "2") if workers else ()))
        try:
            grandchildren = children(t.child)
            assert len(grandchildren) >= workers
            t.proc.send_signal(signal.SIGHUP)
            assert t.proc.wait(60) == 0
            assert _gone(t.child)
            assert all(_gone(g) for g in grandchildren)
            deadline = time.monotonic() + 10
            while b"llmtop: served" not in bytes(t.out) and time.monotonic() < deadline:
                time.sleep(0.1)
            tail = bytes(t.out)
            assert b"\x1b[?1049l" in tail  # the alternate screen left
            assert b"llmtop: served 0 requests" in tail, tail[-1500:]
            assert b"Traceback" not in tail
        finally:
            t.kill()
        assert _complete_gzip(rec)[-1].get("type") == "footer"


def test_closing_the_terminal_stops_the_tui_and_its_proxy(tmp_path: Path) -> None:
    """The terminal window or ssh connection goes (the pty's master closed): the TUI
    must exit and its proxy stop gracefully (recording complete), not run on. (QA: on the
    hung-up terminal Textual's shutdown blocked for ever on its output queue once the
    TUI caught the SIGHUP; the proxy is now stopped first and the TUI ends within
    HANGUP_EXIT_S.)"""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        t = _Pty(up, rec)
        try:
            t.close_master()
            assert t.proc.wait(60) == 0
            assert _gone(t.child)
        finally:
            t.kill()
        assert _complete_gzip(rec)[-1].get("type") == "footer"


def test_tui_under_nohup_ignores_sighup(tmp_path: Path) -> None:
    """``nohup llmtop run``: SIGHUP ignored at start stays ignored; q still quits."""
    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        t = _Pty(up, rec, preexec_hup_ignored=True)
        try:
            t.proc.send_signal(signal.SIGHUP)
            time.sleep(1)
            assert t.proc.poll() is None and _alive(t.child)
            assert t.quit() == 0
            assert _gone(t.child)
        finally:
            t.kill()
        assert _complete_gzip(rec)[-1].get("type") == "footer"


@pytest.mark.parametrize("workers", [0, 2])
def test_headless_piped_to_head_goes_on_forwarding(tmp_path: Path, workers: int) -> None:
    """``llmtop run --headless … 2>&1 | head -1``: head leaves after the first line. QA: the
    next status line (``admin listening``, ``recording to``) raised BrokenPipeError and
    killed the proxy at start-up with a traceback, the recording cut. Decided: the proxy
    goes on forwarding and drops its lines (pipe_out); SIGTERM then stops it as ever,
    exit 0, recording complete."""
    rec = tmp_path / "r.jsonl.gz"
    r, w = os.pipe()
    extra = ["--workers", "2"] if workers else []
    with sim() as up:
        p = subprocess.Popen(
            [*PY, "run", "--headless", "--upstream", up, "--listen", "127.0.0.1:0",
             "--admin", "127.0.0.1:0", "--gpu-source", "none", "--record", str(rec), *extra],
            stdout=w, stderr=w)
        os.close(w)
        try:
            with os.fdopen(r) as head:  # head -1
                first = head.readline()
            assert first.startswith("llmtop: proxy listening on "), first
            proxy = first.rsplit(" ", 1)[1].strip()
            for _ in range(3):  # forwarding goes on, its status lines unread
                assert b"[DONE]" in _chat(proxy)
            assert p.poll() is None
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 0
        finally:
            _kill_all(p)
        records = _complete_gzip(rec)
        assert records[-1].get("type") == "footer"
        assert sum(1 for x in records if x.get("type") == "request") == 3, records


FIXTURE = Path(__file__).parent.parent / "fixtures" / "recordings" / "sim_tiny_ramp.jsonl.gz"


def _to_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``llmtop ARGS | head`` with head already gone: stdout a pipe with no reader, so
    the first write fails (EPIPE), however little is written."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*PY, *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False)
    finally:
        os.close(w)


@pytest.mark.parametrize("args", [("report", str(FIXTURE)),
                                  ("report", "--format", "json", str(FIXTURE)),
                                  ("export", "--hlog", "-", str(FIXTURE))])
def test_recording_commands_into_a_closed_pipe(args: tuple[str, ...]) -> None:
    """``llmtop report FILE | head -1``: QA: a BrokenPipeError traceback and exit 1. Now
    quiet, 141 (what a SIGPIPE death reads as; ``export --hlog -`` already did so)."""
    done = _to_closed_pipe(*args)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 141, (done.returncode, done.stderr)


def test_bench_into_a_closed_pipe_finishes_its_record(tmp_path: Path) -> None:
    """``llmtop bench … --record F | head -3``: bench already stopped writing to the
    gone reader quietly (exit 0) and its --record file is complete (coverage)."""
    rec = tmp_path / "b.jsonl"
    with sim() as up:
        done = _to_closed_pipe("bench", up, "--concurrency", "1,2", "--requests", "4",
                               "--max-tokens", "8", "--record", str(rec))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    assert lines and lines[-1]["type"] == "footer", lines[-1:]
    assert sum(1 for x in lines if x["type"] == "bench_step") == 2


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_mid_level_bench_says_the_finished_levels(tmp_path: Path,
                                                         sig: signal.Signals, code: int) -> None:
    """``timeout 5 llmtop bench …``: SIGTERM during the second level. Already behaved
    (coverage): exit 143 (``timeout`` itself then exits 124, or 143 with
    --preserve-status), the finished level's row and the interruption said, the --record
    file complete with its footer. SIGHUP (the ssh session closed) killed bench at once
    (exit -1, the record without its footer); now the same as SIGTERM, exit 129."""
    rec = tmp_path / "b.jsonl"
    with sim() as up:
        p = subprocess.Popen(
            [*PY, "bench", up, "--concurrency", "1,2", "--duration", "10", "--max-tokens",
             "8", "--record", str(rec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines: list[str] = []
            # (level 2 lasts 10 s: the signal lands well inside it)
            _until(lines, "concurrency 2: starting", p.stderr, within_s=300)
            p.send_signal(sig)
            out, err = p.communicate(timeout=60)
        finally:
            _kill_all(p)
    assert p.returncode == code, (p.returncode, out, err)
    assert "Traceback" not in err
    assert "interrupted during concurrency 2" in out + err, (out, err)
    assert any(row.lstrip("▶ ").startswith("1 ") for row in out.splitlines()), out
    records = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    assert records[-1]["type"] == "footer"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_for(cond: object, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_ctrl_z_restores_the_terminal_and_the_proxy_forwards_meanwhile(tmp_path: Path) -> None:
    """Ctrl-Z (SIGTSTP) on the TUI: Textual leaves the alternate screen and stops; the
    proxy, a process of its own, forwards meanwhile; ``fg`` (SIGCONT) takes the screen
    again and q still quits. Already behaved (coverage)."""
    import re

    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        t = _Pty(up, rec)
        try:
            m = re.search(rb"proxy listening on (http://127\.0\.0\.1:[0-9]+)", bytes(t.out))
            assert m is not None, bytes(t.out)[:2000]
            proxy = m[1].decode()
            mark = len(t.out)
            t.proc.send_signal(signal.SIGTSTP)
            assert _wait_for(lambda: _state(t.proc.pid) == "T"), _state(t.proc.pid)
            assert _wait_for(lambda: b"\x1b[?1049l" in bytes(t.out[mark:]))  # screen given back
            assert b"[DONE]" in _chat(proxy)  # forwarding while the TUI is stopped
            mark = len(t.out)
            t.proc.send_signal(signal.SIGCONT)
            assert _wait_for(lambda: b"\x1b[?1049h" in bytes(t.out[mark:]))  # and taken again
            assert _state(t.proc.pid) != "T"
            assert t.quit() == 0
            assert _gone(t.child)
        finally:
            t.kill()
        records = _complete_gzip(rec)
        assert records[-1].get("type") == "footer"
        assert sum(1 for x in records if x.get("type") == "request") == 1


def test_sighup_stops_demo_and_its_three_processes(tmp_path: Path) -> None:
    """``llmtop demo --headless`` over ssh, the session closed: QA: SIGHUP killed the demo
    at once (exit -1), its sim, proxy and driver left to their parent watch. Now as
    Ctrl-C: the three stopped, the proxy's summary, exit 0, the recording complete."""
    rec = tmp_path / "d.jsonl.gz"
    p = subprocess.Popen([*PY, "demo", "--headless", "--record", str(rec)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        _until(lines, "llmtop: recording to ", p.stdout)
        kids = children(p.pid)
        assert len(kids) == 3, kids
        p.send_signal(signal.SIGHUP)
        out, err = p.communicate(timeout=90)
    finally:
        _kill_all(p)
    assert p.returncode == 0, (p.returncode, out, err)
    assert "Traceback" not in err, err
    assert "llmtop: served" in out, out
    assert all(_gone(k) for k in kids)
    assert _complete_gzip(rec)[-1].get("type") == "footer"


def test_sigterm_twice_to_the_tui_stops_now_with_summary(tmp_path: Path) -> None:
    """An impatient user: SIGTERM twice to ``llmtop run`` (TUI) while a stream is open.
    QA: the second one's KeyboardInterrupt escaped the wait for the proxy: exit 130, no
    summary, the proxy hurried only by its parent watch. Now passed on to the proxy (its
    "stop now"): exit 0, the summary, the proxy gone, the recording complete."""
    import re

    rec = tmp_path / "r.jsonl.gz"
    with sim() as up:
        t = _Pty(up, rec)
        try:
            m = re.search(rb"proxy listening on (http://127\.0\.0\.1:[0-9]+)", bytes(t.out))
            assert m is not None
            body = json.dumps({"model": "m", "max_tokens": 1500, "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            req = urllib.request.Request(m[1].decode() + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.read(1)
                t.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                t.proc.send_signal(signal.SIGTERM)
                assert t.proc.wait(60) == 0
            assert _gone(t.child)
            assert _wait_for(lambda: b"llmtop: served 1 request" in bytes(t.out), 10), \
                bytes(t.out)[-1500:]
            assert b"Traceback" not in bytes(t.out)
        finally:
            t.kill()
        assert _complete_gzip(rec)[-1].get("type") == "footer"


def test_sigterm_to_demo_under_its_tui_ends_it_as_q_does(tmp_path: Path) -> None:
    """``llmtop demo`` with its TUI, stopped by SIGTERM: the TUI ends as q does (through
    the stop event it polls, not a KeyboardInterrupt raised inside Textual, which asyncio
    could report at exit as "Task exception was never retrieved"), its sim, proxy and
    driver stop, the summary is printed, exit 0, the recording complete."""
    rec = tmp_path / "d.jsonl.gz"
    t = _Pty("", rec, argv=[*PY, "demo", "--record", str(rec)])
    try:
        kids = list(t.children)
        assert len(kids) == 3, kids
        t.proc.send_signal(signal.SIGTERM)
        assert t.proc.wait(90) == 0, bytes(t.out)[-1500:]
        assert all(_gone(k) for k in kids)
        assert _wait_for(lambda: b"llmtop: served" in bytes(t.out), 10), bytes(t.out)[-1500:]
        assert b"Traceback" not in bytes(t.out)
    finally:
        t.kill()
    assert _complete_gzip(rec)[-1].get("type") == "footer"
