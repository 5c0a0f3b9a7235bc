"""Lines no recorder writes but a damaged or hand-edited file can hold: each is skipped (or
its value ignored) and said, and nothing is printed as a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import feed, session, write_recording

from llmtop.cli import main
from llmtop.recording.errors import RecordingError
from llmtop.recording.parts import Series, resolve
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder

DEEP = b"[" * 5000 + b"]" * 5000
"""JSON nested deeper than any parser recurses (orjson stops at 1,024, json at Python's
recursion limit): json.loads raised RecursionError, which no reader caught."""


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def test_a_deeply_nested_line_is_a_bad_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, session(20, duration_s=5))
    lines = _lines(path)
    path.write_bytes(b"\n".join([lines[0], b'{"type":"request","user":' + DEEP + b"}",
                                 DEEP, *lines[1:]]))
    with RecordingReader(path) as r:
        n = sum(1 for _ in r)
        assert n == len([x for x in lines[1:] if x]) - 1  # every event (not the footer)
        assert r.bad_lines == 2
        assert r.problems == ["line 2: JSON nested too deeply (not a recording's line)",
                              "line 3: JSON nested too deeply (not a recording's line)"]
    assert main(["report", str(path), "-q", "--format", "json",
                 "-o", str(tmp_path / "r.json")]) == 0
    src = json.loads((tmp_path / "r.json").read_text())["source"]
    assert src["bad_lines"] == 2
    assert main(["export", str(path), "-q", "--hlog", str(tmp_path / "r.hlog")]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_deeply_nested_first_line_is_not_a_recording(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(DEEP + b"\n")
    with pytest.raises(RecordingError, match=r"r\.jsonl: not an llmtop recording"):
        RecordingReader(path)
    assert main(["report", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmtop report: error: r.jsonl: not an llmtop recording"), err


def test_a_part_beginning_deeply_nested_is_left_out(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    parts = list(src.files)
    parts[1].write_bytes(DEEP + b"\n")
    src = resolve(stem)
    assert isinstance(src, Series) and parts[1] not in src.files
    assert any(f"{parts[1].name} is named like one of its parts but does not begin with a "
               "part's header: left out" in n for n in src.notes), src.notes
