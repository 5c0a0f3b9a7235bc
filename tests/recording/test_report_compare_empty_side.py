"""llmtop report A B where one recording holds no request (a header-only file, a proxy that
served nothing): the comparison says that side has none, not that 'its tail percentiles
are noisy' ('B has only 0 requests'), and one request is one, not 'only 1 requests'."""

from __future__ import annotations

import json
from pathlib import Path

from rec_helpers import session, write_recording

from llmtop.cli import main


def _notes(tmp_path: Path, a: Path, b: Path) -> list[str]:
    out = tmp_path / "cmp.json"
    assert main(["report", str(a), str(b), "-q", "--format", "json", "-o", str(out)]) == 0
    return list(json.loads(out.read_text())["notes"])


def test_a_side_without_requests_is_said_to_have_none(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_recording(a, session(120, duration_s=10))
    write_recording(b, [])
    write_recording(c, session(1, duration_s=2))
    notes = _notes(tmp_path, a, b)
    assert "B has no requests: there is nothing of it to compare" in notes, notes
    assert not any("only 0" in n for n in notes), notes
    notes = _notes(tmp_path, c, a)
    assert "A has only 1 request: its tail percentiles are noisy" in notes, notes
    assert main(["report", str(a), str(b), "-q", "-o", str(tmp_path / "cmp.txt")]) == 0
    assert "B has no requests" in (tmp_path / "cmp.txt").read_text()
