"""`llmtop report A B`: the SLO attainment row rounded plainly, so 39 of 40 requests met
against a 97.51 % target read "97.5%" beside a target of 97.5 % — the rounding the single
report stopped doing (2c8da44). The comparison now writes it as the report does: "<97.5%"."""

from __future__ import annotations

from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event


def recording(path: Path, missed: int) -> None:
    t0 = soon()
    recs = [request(i, t0 + 2.0 * i, ttft=1.0 if i < missed else 0.1) for i in range(40)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, events)


def test_the_attainment_row_never_rounds_onto_its_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    recording(a, 1)  # 39 of 40: 97.5 %
    recording(b, 0)  # 40 of 40
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--slo-target", "0.9751", "-q"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.strip().startswith("SLO attainment"))
    assert line.split()[2:4] == ["<97.5%", "100.0%"], line
