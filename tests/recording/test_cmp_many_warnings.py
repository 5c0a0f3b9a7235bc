"""A warning raised and cleared hundreds of times in a recording (one that flapped every
few minutes of a long run) is listed compactly in the text and HTML reports: the first 50
episodes in time order and the others counted by code. Before, every episode was a line
(600 episodes: 600 lines of the text report, 600 rows of the HTML table). The JSON report
keeps them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event, WarningEvent


@pytest.fixture()
def rec(tmp_path: Path) -> Path:
    t0 = soon()
    ev: list[Event] = [request(i, t0 + i, user="alice") for i in range(10)]
    for k in range(600):  # QUEUEING 500 times, KV_PRESSURE 100 times
        code = "KV_PRESSURE" if k % 6 == 5 else "QUEUEING"
        t = t0 + 0.01 * k
        ev += [WarningEvent(t=t, code=code, severity="warning", message=f"episode {k}",
                            state="raised"),
               WarningEvent(t=t + 0.005, code=code, severity="warning", message="",
                            state="cleared")]
    ev.sort(key=lambda e: getattr(e, "t", None) or e.t_start + e.e2e_s)  # type: ignore[union-attr]
    path = tmp_path / "r.jsonl"
    write_recording(path, ev)
    return path


def test_text_lists_fifty_and_counts_the_rest(rec: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(rec), "-q"]) == 0
    section = capsys.readouterr().out.split("WARNINGS\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    assert len(lines) == 51, len(lines)
    assert "episode 0 " in lines[0] and "episode 49 " in lines[49]
    assert lines[50] == ("  … and 550 more (QUEUEING 458, KV_PRESSURE 92; --format json "
                         "lists them all)")


def test_html_lists_fifty_and_counts_the_rest(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(rec), "-q", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "episode 49<" in page and "episode 50<" not in page
    assert "… and 550 more (QUEUEING 458, KV_PRESSURE 92; --format json lists them all)" in page


def test_json_has_every_episode(rec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(rec), "-q", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["warnings"]) == 600
