"""A recording header's own fields (bench's, or any a recording made elsewhere carries)
are listed compactly in the text and HTML reports: a value in words is shortened like any
long string (a bench header with 3,000 levels was one line of 17,000 characters), and past
20 fields the rest are counted, not listed (300 fields were 300 lines). The JSON report
keeps them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main

LEVELS = list(range(1, 3001))


@pytest.fixture()
def rec(tmp_path: Path) -> Path:
    path = tmp_path / "r.jsonl"
    header = {"upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5},
              "source": "bench", "bench": {"mode": "concurrency", "levels": LEVELS},
              **{f"field{i}": i for i in range(300)}}
    write_recording(path, session(40, duration_s=5.0), header=header)
    return path


def conditions(out: str) -> list[str]:
    return out.split("CONDITIONS\n", 1)[1].split("\n\n", 1)[0].splitlines()


def test_text_lists_header_fields_compactly(rec: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(rec), "-q"]) == 0
    lines = conditions(capsys.readouterr().out)
    bench = next(line for line in lines if line.lstrip().startswith("bench "))
    assert bench.startswith("  bench           mode concurrency; levels 1, 2, 3,")
    assert len(bench) < 300 and bench.endswith(" characters)"), len(bench)
    assert "3000" in bench  # its end is kept
    assert sum(line.lstrip().startswith("field") for line in lines) == 18  # 20 with two above
    assert "  …               282 more header fields (--format json lists them)" in lines
    assert max(len(line) for line in lines) < 400


def test_html_lists_header_fields_compactly(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(rec), "-q", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "282 more header fields" in page
    assert "field17<" in page and "field18<" not in page
    assert ", 1500, " not in page  # the middle of the levels is not in it


def test_json_keeps_every_header_field(rec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(rec), "-q", "--format", "json"]) == 0
    extra = json.loads(capsys.readouterr().out)["conditions"]["extra"]
    assert extra["bench"]["levels"] == LEVELS and extra["field299"] == 299
