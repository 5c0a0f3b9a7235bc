"""A killed ``.jsonl.gz`` followed by bytes that are not its continuation still reads up to
the damage: zlib returns nothing of a ``decompress`` call that fails, so the reader fed a
megabyte at a time used to lose everything in that megabyte — the whole file when it is
small ("compressed recording is empty or corrupt", exit 2), where ``zcat`` recovers it.

The bytes after the cut: zeros (what a crash leaves at the end of a file on ext4/XFS when
its size was updated before its data), or a second recording (``cat killed.gz other.gz``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader


def killed_gz(tmp_path: Path, n: int) -> tuple[Path, int]:
    """A .jsonl.gz as a ``kill -9`` leaves it (flushed, no gzip trailer, no footer), and
    how many requests it holds."""
    path = tmp_path / "live.jsonl.gz"
    events = session(n, duration_s=5)
    rec = write_recording(path, events, stop=False)
    try:
        for _ in range(200):
            if not rec.status()["queued"]:
                break
            time.sleep(0.02)
        snap = tmp_path / "killed.jsonl.gz"
        deadline = time.monotonic() + 20.0
        while True:  # past a flush period: copy until a copy holds every request
            shutil.copyfile(path, snap)
            with RecordingReader(snap) as r:
                held = sum(isinstance(e, RequestRecord) for e in r)
            if held >= sum(isinstance(e, RequestRecord) for e in events) or (
                    time.monotonic() > deadline):
                break
            time.sleep(0.05)
    finally:
        rec.stop()
    with RecordingReader(snap) as r:
        requests = sum(isinstance(e, RequestRecord) for e in r)
    assert requests == sum(isinstance(e, RequestRecord) for e in events)
    return snap, requests


def report_requests(path: Path) -> int:
    p = subprocess.run([sys.executable, "-m", "llmtop", "report", str(path), "--format",
                        "json", "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return int(json.loads(p.stdout)["conditions"]["requests"])


@pytest.mark.parametrize("after", ["zeros", "another recording"])
def test_killed_gzip_followed_by_other_bytes_reads_to_the_damage(tmp_path: Path,
                                                                 after: str) -> None:
    snap, n = killed_gz(tmp_path, 200)
    damaged = tmp_path / "damaged.jsonl.gz"
    tail = b"\0" * 4096 if after == "zeros" else snap.read_bytes()
    damaged.write_bytes(snap.read_bytes() + tail)
    with RecordingReader(damaged) as r:
        got = sum(isinstance(e, RequestRecord) for e in r)
        s = r.summary()
    assert got == n
    assert s["gzip_incomplete"] is True and s["complete"] is False
    assert report_requests(damaged) == n


def test_damage_in_a_large_file_keeps_the_megabytes_before_it(tmp_path: Path) -> None:
    """Over several read chunks: what came before the damaged megabyte, and the part of it
    before the damage, are read."""
    import gzip

    from llmtop.recording.writer import FORMAT, VERSION

    lines = [json.dumps({"type": "header", "format": FORMAT, "version": VERSION,
                         "started_at": time.time(), "upstream": "u", "slo": {}})]
    lines += [json.dumps({"type": "warning", "t": time.time() + i * 1e-3, "code": "QUEUEING",
                          "severity": "warning", "message": f"m{i} " + "x" * 200,
                          "state": "raised"}) for i in range(60_000)]
    data = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=0)
    cut = int(len(data) * 0.7)  # well past the first megabyte, not on a chunk boundary
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(data[:cut] + b"\0" * 100_000)
    with RecordingReader(path) as r:
        got = sum(1 for _ in r)
        s = r.summary()
    assert s["gzip_incomplete"] is True
    # stored blocks (level 0): the text up to the cut, less the cut-off last line
    assert got >= int(60_000 * 0.7) - 200, got


def test_zero_padding_after_a_complete_gzip_is_not_damage(tmp_path: Path) -> None:
    """A complete .jsonl.gz followed by zero bytes (a preallocated or block-padded file;
    gzip ignores them) read every request but said the compressed data ended early."""
    path = tmp_path / "whole.jsonl.gz"
    events = session(50, duration_s=5)
    write_recording(path, events)  # stopped: footer and gzip trailer written
    n = sum(isinstance(e, RequestRecord) for e in events)
    for pad in (b"\0" * 10, b"\0" * (3 << 20)):  # within the last piece; over several
        padded = tmp_path / "padded.jsonl.gz"
        padded.write_bytes(path.read_bytes() + pad)
        with RecordingReader(padded) as r:
            got = sum(isinstance(e, RequestRecord) for e in r)
            assert got == n
            assert r.footer is not None
            assert not r.summary()["gzip_incomplete"]  # said "ends early"
            assert not r.problems, r.problems
        assert report_requests(padded) == n
    # zeros and then something that is not gzip: that is damage, and is said
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(path.read_bytes() + b"\0" * 100 + b"not gzip at all")
    with RecordingReader(damaged) as r:
        assert sum(isinstance(e, RequestRecord) for e in r) == n
        assert r.summary()["gzip_incomplete"]
