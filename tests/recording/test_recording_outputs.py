"""`report -o` and `export --hlog/--parquet` refuse to write over the recording they read
(they used to replace it with their output and exit 0)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("out") / "r.jsonl"
    write_recording(path, session(20, duration_s=4))
    return path.read_bytes()


CASES = [
    (["report", "IN", "-o", "IN"], "IN"),
    (["report", "IN", "-o", "./IN"], "IN"),
    (["report", "IN", "--format", "html", "-o", "IN"], "IN"),
    (["report", "IN", "--format", "json", "-o", "LINK"], "IN"),
    (["report", "OTHER", "IN", "-o", "IN"], "IN"),  # the second of two inputs
    (["report", "DOTPART", "-o", "Y"], "DOTPART"),  # -o y.jsonl is first written there
    (["export", "IN", "--hlog", "IN"], "IN"),
    (["export", "IN", "--hlog", "./IN"], "IN"),
    (["export", "HARD", "--hlog", "IN"], "IN"),  # a hard link: same inode
    (["export", "IN", "--parquet", "IN"], "IN"),
    (["export", "PQIN", "--parquet", "PQDIR"], "PQIN"),
]


@pytest.mark.parametrize(("argv", "victim"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_output_that_is_an_input_is_refused_and_the_input_kept(
        tmp_path: Path, original: bytes, capsys: pytest.CaptureFixture[str], argv: list[str],
        victim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    names = {"IN": "x.jsonl", "OTHER": "other.jsonl", "LINK": "link.jsonl", "HARD": "hard.jsonl",
             "DOTPART": ".y.jsonl.part", "Y": "y.jsonl", "PQDIR": "pq",
             "PQIN": "pq/requests.parquet", "./IN": "./x.jsonl"}
    for key in ("IN", "OTHER", "DOTPART"):
        (tmp_path / names[key]).write_bytes(original)
    (tmp_path / "pq").mkdir()
    (tmp_path / names["PQIN"]).write_bytes(original)
    os.symlink(names["IN"], tmp_path / names["LINK"])
    os.link(tmp_path / names["IN"], tmp_path / names["HARD"])
    assert main([*(names.get(a, a) for a in argv), "-q"]) == 2
    err = capsys.readouterr().err
    assert "output is the input file" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / names[victim]).read_bytes() == original
    for key in ("IN", "OTHER", "DOTPART", "PQIN"):
        assert (tmp_path / names[key]).read_bytes() == original


def test_a_different_output_is_still_written(tmp_path: Path, original: bytes) -> None:
    src = tmp_path / "x.jsonl"
    src.write_bytes(original)
    assert main(["report", str(src), "-q", "-o", str(tmp_path / "x.txt")]) == 0
    assert main(["export", str(src), "-q", "--hlog", str(tmp_path / "x.hlog")]) == 0
    assert main(["export", str(src), "-q", "--parquet", str(tmp_path / "pq")]) == 0
    assert "CONDITIONS" in (tmp_path / "x.txt").read_text()
    assert (tmp_path / "x.hlog").read_text().count("Tag=ttft,") >= 1
    assert (tmp_path / "pq" / "requests.parquet").stat().st_size > 0
    assert src.read_bytes() == original
