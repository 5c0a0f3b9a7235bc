"""A comparison says what each file's reader skipped, as a single report does: it said
nothing of bad lines, cut-off lines or damaged compressed data (the JSON had them only
inside each report's source), and 'no footer read: ... damaged' pointed at no file notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_recording(a, session(60, duration_s=10))
    write_recording(b, session(60, duration_s=10, seed=2))
    lines = b.read_bytes().splitlines()
    lines[4] = b'{"type":"request","id":'
    b.write_bytes(b"\n".join(lines) + b"\n")
    return a, b


@pytest.mark.parametrize("fmt", ["text", "html"])
def test_a_comparison_names_each_files_skipped_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    a, b = _pair(tmp_path)
    out = tmp_path / f"c.{fmt}"
    assert main(["report", str(a), str(b), "-q", "--format", fmt, "-o", str(out)]) == 0
    page = out.read_text()
    assert "B (b.jsonl): 1 bad line skipped" in page
    assert "B (b.jsonl): line 5: not JSON" in page
    assert "A (a.jsonl):" not in page  # read cleanly: nothing to say


def test_a_comparison_json_has_the_notes(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _pair(tmp_path)
    assert main(["report", str(a), str(b), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "B (b.jsonl): 1 bad line skipped" in doc["notes"]
