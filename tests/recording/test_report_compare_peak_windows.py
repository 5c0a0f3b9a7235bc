"""`llmtop report A B`: the peak output rate of two recordings is compared only over
windows of one length (QA hunt: report vs recording).

A report's peak tok/s is the busiest window of its time series, whose window grows with
the recording's length (10 s up to 20 min, 60 s up to 10 h, then 300 s). The same
workload recorded for 2 minutes and for 2 hours read a peak "0.60x" as high in the longer
one — the busiest 10 s against the busiest minute — with the conditions matching and the
ratio shown. Recordings are written by the real recorder, read back by ``llmtop report``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event


def steady(path: Path, seconds: float) -> None:
    """One 10-token request every 9 s (the same workload whatever the length)."""
    t0 = soon()
    recs = [request(i, t0 + 9.0 * i, n_chunks=10) for i in range(int(seconds // 9))]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, events)


def compare(capsys: pytest.CaptureFixture[str], a: Path, b: Path,
            fmt: str = "json") -> Any:
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--format", fmt, "-q"]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else out


def test_peaks_over_windows_of_different_lengths_have_no_ratio(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    steady(short, 120)
    steady(long, 7200)
    cmp = compare(capsys, short, long)
    assert cmp["conditions_match"]  # the same workload: every other ratio is shown
    rows = {r["figure"]: r for r in cmp["figures"]}
    assert rows["system output tok/s"]["ratio_b_over_a"] == pytest.approx(1.0, rel=0.05)
    peak = rows["peak output tok/s"]
    assert peak["a"] is not None and peak["b"] is not None
    assert peak["ratio_b_over_a"] is None
    assert any("peak" in n and "10 s" in n and "60 s" in n for n in cmp["notes"])
    text = compare(capsys, short, long, fmt="text")
    line = next(x for x in text.splitlines() if x.strip().startswith("peak output tok/s"))
    assert line.split()[-1] == "withheld"


def test_peaks_over_windows_of_one_length_keep_their_ratio(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    steady(a, 120)
    steady(b, 150)
    cmp = compare(capsys, a, b)
    peak = next(r for r in cmp["figures"] if r["figure"] == "peak output tok/s")
    assert peak["ratio_b_over_a"] is not None
    assert not any("peak" in n for n in cmp["notes"])
