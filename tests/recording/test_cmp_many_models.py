"""A recording whose clients named a new model in every request (a request id in the
model field, say) lists its models compactly: the first ten and how many more, in the
text and HTML reports' conditions and a comparison's. Before, 2,000 models made one line
of 30,954 characters, and a comparison's 'different models' warning another of 22,971.
When both sides have too many to list, the warning names first the ones the other side
lacks: what differs is what it shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main


def make(path: Path, models: list[str]) -> Path:
    t0 = soon()
    write_recording(path, [dataclasses.replace(request(i, t0 + i * 0.01), model=m)
                           for i, m in enumerate(models)])
    return path


MANY = [f"model-{i:04d}" for i in range(2000)]


def report(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["report", *args, "-q"]) == 0
    return capsys.readouterr().out


def test_many_models_are_counted_not_listed(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rec = make(tmp_path / "r.jsonl", MANY)
    out = report(capsys, str(rec))
    line = next(x for x in out.splitlines() if x.startswith("  models "))
    assert line.endswith(", … and 1,990 more") and len(line) < 300, len(line)
    assert max(len(x) for x in out.splitlines()) < 1000
    page = tmp_path / "r.html"
    report(capsys, str(rec), "--format", "html", "-o", str(page))
    html = page.read_text()
    assert "… and 1,990 more" in html and "model-1500" not in html


def test_a_comparison_shows_what_differs_first(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a = make(tmp_path / "a.jsonl", MANY)
    b = make(tmp_path / "b.jsonl", [*MANY[:-1], "other-model"])  # one model in 2,000 differs
    out = report(capsys, str(a), str(b))
    warn = next(x for x in out.splitlines() if "! different models" in x)
    assert warn == ("  ! different models: A model-1999, model-0000, model-0001, model-0002, "
                    "model-0003, model-0004, model-0005, model-0006, model-0007, model-0008, "
                    "… and 1,990 more; B other-model, model-0000, model-0001, model-0002, "
                    "model-0003, model-0004, model-0005, model-0006, model-0007, model-0008, "
                    "… and 1,990 more")
    assert max(len(x) for x in out.splitlines()) < 1000


def test_a_few_models_are_listed_as_before(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = make(tmp_path / "a.jsonl", ["m-8b", "m-70b"] * 5)
    b = make(tmp_path / "b.jsonl", ["m-8b"] * 10)
    out = report(capsys, str(a), str(b))
    assert "  ! different models: A m-70b, m-8b; B m-8b" in out
    assert "  models          m-8b (5), m-70b (5)" in report(capsys, str(a))
