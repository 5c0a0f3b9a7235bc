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

PY = [sys.executable, "-m", "llmtop"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _kill_all(proc: subprocess.Popen[str]) -> None:
    for pid in [*_children(proc.pid), proc.pid]:
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
            kids = _children(p.pid)
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
