"""`llmtop report`'s time series covers the whole recording (QA hunt: report vs recording).

A long recording's series grows its step (2 → 10 → 60 → 300 s) to stay under 600 points.
It used to thin the points already taken (every k-th kept), so the early part of a long
recording was left as 10 s windows one minute apart (or 60 s windows five minutes apart):
most of its traffic was in no point, and the peak rate mixed 10 s and 300 s windows. And
the stretch after the last whole step was in no point either. A recording with a burst at
its start and one a day later read "0.0 tok/s peak" beside a mean above zero, its series
all zeros. Recordings are written by the real recorder, read back by ``llmtop report``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord


def report_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def write(path: Path, recs: list[RequestRecord]) -> None:
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, events)


def check_series(r: dict[str, Any], n: int) -> None:
    """Every point has the series' window, the points reach the last event, every
    request ends inside at least one point's window, and the peak is not below the mean."""
    series, th = r["series"], r["throughput"]
    window = th["series_window_s"]
    assert {p["window_s"] for p in series} == {window}
    assert series[-1]["t"] == pytest.approx(r["conditions"]["duration_s"], abs=1e-6)
    # windows of one step tile the recording (overlapping by at most a fine interval):
    # each request is counted by at least one point
    assert sum(p["requests"] for p in series) >= n
    assert th["output_tps_peak"] >= th["output_tps"] > 0


def test_a_day_between_two_bursts_keeps_both_in_the_series(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = soon()
    recs = [request(i, t0 + i, tokens_per_chunk=3) for i in range(5)]
    recs += [request(10 + i, t0 + 86_400 + i) for i in range(5)]
    path = tmp_path / "gap.jsonl"
    write(path, recs)
    r = report_json(capsys, path)
    assert r["throughput"]["series_step_s"] == 300
    check_series(r, len(recs))
    busy = [p for p in r["series"] if p["requests"]]
    assert busy[0]["t"] < 400 and busy[-1]["t"] > 86_400  # both bursts


def test_a_two_hour_recording_is_all_in_its_series(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one request every 9 s for 2 h: 60 s steps; before, the first 6,000 s were 10 s
    # windows a minute apart (a sixth of their requests) and the last partial step none
    t0 = soon()
    recs = [request(i, t0 + 9.0 * i, n_chunks=4) for i in range(800)]
    path = tmp_path / "long.jsonl"
    write(path, recs)
    r = report_json(capsys, path)
    assert r["throughput"]["series_step_s"] == 60
    check_series(r, len(recs))
    # a 60 s window holds 6 or 7 of them: no point reads a 10 s window's 1 or 2
    assert min(p["requests"] for p in r["series"][1:-1]) >= 6


@pytest.mark.parametrize(("seconds", "step"), [(300, 2), (7200, 60)])
def test_every_point_covers_exactly_its_window(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], seconds: int, step: int) -> None:
    # the aggregator's windows are whole intervals (2 s fine, 10 s coarse) plus the one
    # open now: a point taken off their edges covered 11 s of a "10 s" window (60-70 s of
    # a "60 s" one), as the recording's start second fell, so two recordings' peaks were
    # over windows of different lengths. A point's span is its requests / its rate.
    t0 = soon()
    recs = [request(i, t0 + 3.0 * i, n_chunks=4) for i in range(int(seconds // 3))]
    path = tmp_path / "steady.jsonl"
    write(path, recs)
    r = report_json(capsys, path)
    th = r["throughput"]
    assert th["series_step_s"] == step
    window = th["series_window_s"]
    full = [p for p in r["series"][:-1] if p["t"] >= window and p["requests"]]
    assert len(full) > 10
    for p in full:
        assert p["requests"] / p["rps"] == pytest.approx(window, abs=1e-6)
