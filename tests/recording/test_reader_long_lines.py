"""Lines longer than a read chunk: gathered once, not re-copied chunk by chunk (a
zero-filled tail of 300 MB took 24 s to read, 100 MB 3 s), and a line past the reader's
limit is skipped and said without being held whole."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import RequestRecord
from llmtop.recording.reader import MAX_LINE, RecordingReader

MIB = 1 << 20


def _lines(tmp_path: Path) -> list[bytes]:
    path = tmp_path / "base.jsonl"
    write_recording(path, session(20, duration_s=4, errors_every=0, timeouts_every=0))
    return path.read_bytes().splitlines()


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_a_line_past_the_limit_is_skipped_and_the_rest_read(tmp_path: Path, gz: bool) -> None:
    lines = _lines(tmp_path)
    with RecordingReader(tmp_path / "base.jsonl") as r:
        want = list(r)
    junk = b"\0" * (3 * MIB + 17)  # (a crash's zero-filled blocks, then the writer went on)
    data = b"\n".join([*lines[:5], junk, *lines[5:], b'{"type":"request"}']) + b"\n"
    path = tmp_path / ("j.jsonl.gz" if gz else "j.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    with RecordingReader(path, max_line=MIB) as r:
        assert list(r) == want
        assert (r.bad_lines, r.truncated_lines) == (2, 0)
        assert r.problems[0] == "line 6: longer than 1 MiB, not a recording's line"
        # the lines after it keep their numbers
        assert r.problems[1].startswith(f"line {len(lines) + 2}: request: no id field")


def test_a_cut_off_last_line_past_the_limit_is_a_truncated_line(tmp_path: Path) -> None:
    lines = _lines(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines[:-1]) + b"\n" + b"\0" * (2 * MIB + 5))
    with RecordingReader(path, max_line=MIB) as r:
        n = len(list(r))
        assert (r.bad_lines, r.truncated_lines, r.problems) == (0, 1, [])
    assert n == len(lines) - 2  # the header and the footer are not events


def test_lines_spanning_many_chunks_read_whole(tmp_path: Path) -> None:
    """Lines of several MiB (a request of 300,000 chunks) within the limit, back to back."""
    lines = _lines(tmp_path)
    base = json.loads(next(ln for ln in lines if b'"request"' in ln))
    n = 300_000
    long = {**base, "id": "long", "chunk_offsets_s": [0.2 + i * 1e-5 for i in range(n)],
            "e2e_s": 0.2 + n * 1e-5,
            "chunk_tokens": [1] * n, "completion_tokens": n}
    text = json.dumps(long).encode()
    assert len(text) > 3 * MIB
    path = tmp_path / "l.jsonl"
    path.write_bytes(b"\n".join([*lines[:3], text, text, *lines[3:]]) + b"\n")
    with RecordingReader(path) as r:
        got = [e for e in r if isinstance(e, RequestRecord) and e.id == "long"]
        assert r.bad_lines == 0
    assert len(got) == 2 and got[0] == got[1] and len(got[0].chunk_tokens) == n
    assert MAX_LINE >= 256 * MIB  # a real answer's line is far below it


def test_report_of_a_recording_with_a_huge_zero_tail(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """30 MB of NUL bytes after the footer (no newline): read as a cut-off last line."""
    lines = _lines(tmp_path)
    path = tmp_path / "z.jsonl"
    with path.open("wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
        fh.write(b"\0" * (30 * MIB))
    assert main(["report", str(path), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["truncated_lines"] == 1 and doc["conditions"]["requests"] == 20
