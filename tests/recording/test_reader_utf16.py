"""A recording re-saved as UTF-16 (Windows PowerShell 5's `>` and Out-File write UTF-16LE
with a byte-order mark; some editors save so): its header was read (json.loads guesses a
line's encoding) and every other line was 'not JSON', so llmtop report said 0 requests and
N bad lines. It is read as what it is, and that is said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.recording.reader import RecordingReader

ENCODINGS = {"utf-16": "utf-16", "utf-16-le": "utf-16-le", "utf-16-be": "utf-16-be",
             "utf-16 crlf": "utf-16"}


@pytest.mark.parametrize("kind", list(ENCODINGS))
def test_a_utf16_recording_reads_whole(tmp_path: Path, kind: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "r.jsonl"
    write_recording(plain, session(40, duration_s=5, users=("alice", "bøb", "キャロル")))
    text = plain.read_text(encoding="utf-8")
    if "crlf" in kind:
        text = text.replace("\n", "\r\n")
    path = tmp_path / "r16.jsonl"
    path.write_bytes(text.encode(ENCODINGS[kind]))
    with RecordingReader(plain) as r:
        want = [repr(e) for e in r]
    with RecordingReader(path) as r:
        got = [repr(e) for e in r]
        s = r.summary()
    assert got == want
    assert s["bad_lines"] == 0 and s["truncated_lines"] == 0 and s["complete"]
    assert s["problems"] == ["the file is UTF-16, not UTF-8 as llmtop writes: read as UTF-16 "
                             "(iconv -f UTF-16 -t UTF-8 converts it)"]
    out = tmp_path / "r.json"
    assert main(["report", str(path), "-q", "--format", "json", "-o", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["conditions"]["requests"] == 40
    assert "bøb" in {u["user"] for u in rep["users"]}
