"""QA of `llmtop export` and `llmtop replay` as a user drives them: stdout, signals, damaged
input, awkward numbers (real files, a FIFO and subprocesses)."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.recording.replay import ReplaySource


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, session(120, duration_s=30))
    return path


def test_hlog_dash_goes_to_stdout_not_a_file_named_dash(rec: Path, tmp_path: Path) -> None:
    r = run_cli("export", str(rec), "--hlog", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists()
    assert r.stdout.startswith("#[llmtop recording s.jsonl.gz")
    assert "Tag=ttft," in r.stdout
    assert "llmtop export: wrote standard output" in r.stderr  # the summary stays off stdout
    assert "wrote" not in r.stdout


def test_hlog_dash_into_a_closed_pipe_stops_quietly(rec: Path, tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-m", "llmtop", "export", str(rec), "--hlog", "-",
                          "--interval", "0.01"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read()
    p.stderr.close()
    assert p.wait(timeout=60) == 141
    assert "error" not in err and "Traceback" not in err
    assert not (tmp_path / "-").exists()  # stdout, not a file named "-"


def test_parquet_dash_is_refused(rec: Path, tmp_path: Path) -> None:
    r = run_cli("export", str(rec), "--parquet", "-", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "directory" in r.stderr
    assert not (tmp_path / "-").exists()


def test_hlog_into_a_directory_or_missing_directory(rec: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    r = run_cli("export", str(rec), "--hlog", "d", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == ("llmtop export: error: d: is a directory; give a file name "
                                "for the log")
    assert list((tmp_path / "d").iterdir()) == []
    assert not (tmp_path / ".d.part").exists()
    r = run_cli("export", str(rec), "--hlog", "nowhere/x.hlog", cwd=tmp_path)
    assert r.returncode == 2
    assert "no directory nowhere" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["0.0001", "1e-9"])
def test_sub_millisecond_interval_is_refused(rec: Path, tmp_path: Path, value: str) -> None:
    r = run_cli("export", str(rec), "--hlog", str(tmp_path / "a.hlog"), "--interval", value)
    assert r.returncode == 2
    assert "--interval must be at least 0.001" in r.stderr
    assert not (tmp_path / "a.hlog").exists()


def test_damaged_and_unfinished_recordings_are_noted(rec: Path, tmp_path: Path) -> None:
    lines = gzip.decompress(rec.read_bytes()).splitlines(keepends=True)
    assert b'"footer"' in lines[-1]
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"".join([*lines[:3], b"garbage{\n", b"\xff\xfe\n", *lines[3:-1]]))
    quiet = run_cli("export", str(damaged), "--parquet", str(tmp_path / "q"), "-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    r = run_cli("export", str(damaged), "--parquet", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    assert "2 bad lines skipped" in r.stderr
    assert "no footer (the recorder was killed or is still running)" in r.stderr
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(rec.read_bytes()[: rec.stat().st_size // 2])
    r = run_cli("export", str(cut), "--hlog", str(tmp_path / "c.hlog"))
    assert r.returncode == 0, r.stderr
    assert "the compressed data ends early" in r.stderr
    clean = run_cli("export", str(rec), "--hlog", str(tmp_path / "ok.hlog"))
    assert clean.returncode == 0 and "note" not in clean.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("kind", ["--parquet", "--hlog"])
def test_signal_mid_export_leaves_nothing_behind(tmp_path: Path, sig: signal.Signals,
                                                 kind: str) -> None:
    """A recording still being written (a FIFO whose writer has not finished): the export
    waits for more lines; a signal then must remove the temporary files (and the directory
    the export created), say so, and exit 128 + signal."""
    full = tmp_path / "s.jsonl"
    write_recording(full, session(40, duration_s=10))
    head = full.read_bytes().splitlines(keepends=True)[:20]
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / ("out" if kind == "--parquet" else "out.hlog")
    p = subprocess.Popen([sys.executable, "-m", "llmtop", "export", str(fifo), kind, str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(fifo, "wb") as w:
        w.write(b"".join(head) + b"\n" * (1 << 20))  # the reader reads a MB at a time
        w.flush()
        deadline = time.monotonic() + 30
        while not any(f.name.endswith(".part") for f in tmp_path.rglob(".*")):
            assert time.monotonic() < deadline, "the export never started writing"
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        p.send_signal(sig)
        with p:
            _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig
    assert "interrupted; no output written" in err and "Traceback" not in err
    left = sorted(f.name for f in tmp_path.rglob("*"))
    assert left == ["live.jsonl", "s.jsonl"], left


def _fetch(src: ReplaySource) -> dict:  # type: ignore[type-arg]
    async def go() -> dict:  # type: ignore[type-arg]
        await asyncio.sleep(0.01)
        return await asyncio.wait_for(src.fetch(60), 20)

    return asyncio.run(go())


@pytest.mark.parametrize("speed", [1e6, 1e308])
def test_replay_gz_at_huge_speed_holds_the_last_picture(rec: Path, speed: float) -> None:
    """A .gz recording's length is unknown until it has been read: playing past its end
    left an empty picture (1e6) or never returned (1e308: the clock stopped moving)."""
    snap = _fetch(ReplaySource(rec, speed=speed))
    assert snap["replay"]["at_end"]
    assert snap["system"]["requests"] > 0
    plain = rec.with_name("s.jsonl")
    plain.write_bytes(gzip.decompress(rec.read_bytes()))
    same = _fetch(ReplaySource(plain, speed=speed))
    assert snap["system"]["requests"] == same["system"]["requests"]
    assert snap["replay"]["position_s"] == pytest.approx(same["replay"]["position_s"])


def test_replay_start_far_past_the_end(rec: Path, tmp_path: Path) -> None:
    src = ReplaySource(rec)
    src.seek(1e20)  # `--start 1e20`
    snap = _fetch(src)
    assert snap["replay"]["at_end"]
    assert snap["replay"]["position_s"] == pytest.approx(snap["replay"]["duration_s"])
    header_only = tmp_path / "h.jsonl"
    header_only.write_bytes(gzip.decompress(rec.read_bytes()).splitlines(keepends=True)[0])
    src = ReplaySource(header_only, speed=1e308)
    src.seek(1e20)
    snap = _fetch(src)
    assert snap["replay"]["duration_s"] == 0.0 and snap["replay"]["at_end"]


def test_parquet_refuses_a_missing_parent_as_hlog_does(tmp_path: Path) -> None:
    """``--parquet typo/nested/dir`` made the whole tree (``mkdir -p``) where ``--hlog`` and
    ``report -o`` refuse a missing directory; DIR itself is still created."""
    rec = tmp_path / "s.jsonl"
    write_recording(rec, session(20, duration_s=2))
    out = tmp_path / "no" / "such" / "pq"
    p = subprocess.run([sys.executable, "-m", "llmtop", "export", str(rec), "--parquet",
                        str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no directory" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "no").exists()
    p = subprocess.run([sys.executable, "-m", "llmtop", "export", str(rec), "--parquet",
                        str(tmp_path / "pq")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "pq" / "requests.parquet").is_file()


def test_ctrl_c_mid_report_says_so(tmp_path: Path) -> None:
    """``llmtop report`` on a recording still being written (a FIFO) waits for more lines;
    Ctrl-C then exited 130 without a word (export says "interrupted")."""
    full = tmp_path / "s.jsonl"
    write_recording(full, session(40, duration_s=10))
    head = full.read_bytes().splitlines(keepends=True)[:20]
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "r.md"
    # SIGINT as a terminal sends it, even when the test runner was started with it ignored
    p = subprocess.Popen([sys.executable, "-m", "llmtop", "report", str(fifo), "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with open(fifo, "wb") as w:  # (returns once the report has opened it to read)
        w.write(b"".join(head))
        w.flush()
        time.sleep(0.5)  # the report reads what there is and waits for the rest
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)
        with p:
            _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "llmtop report: interrupted; no report written" in err and "Traceback" not in err
    assert sorted(f.name for f in tmp_path.iterdir()) == ["live.jsonl", "s.jsonl"]


def test_parquet_into_a_file_system_that_makes_nothing_names_the_real_cause(
        tmp_path: Path) -> None:
    """``--parquet /proc/x``: mkdir fails with ENOENT though ``/proc`` is there; the error
    said "no directory /proc", which is not so."""
    rec = tmp_path / "s.jsonl"
    write_recording(rec, session(5, duration_s=1))
    p = subprocess.run([sys.executable, "-m", "llmtop", "export", str(rec), "--parquet",
                        "/proc/llmtop-x"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip() == ("llmtop export: error: /proc/llmtop-x: cannot create "
                                "directory: No such file or directory"), p.stderr
