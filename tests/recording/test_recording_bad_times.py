"""Times no recorder writes, in a real recording's header or lines, must not hang or
swamp ``llmtop report``: a ``started_at`` of 1e300 hung it (a replay clock stepping by
half a second stood still at 1e300), one a year before the first request made it plot a
year of empty seconds (830 MB). Each report runs in a process of its own, with a time
limit, so a hang fails the test instead of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent.parent / "fixtures" / "recordings" / "sim_tiny_short.jsonl"


def _with_header(tmp_path: Path, **changes: Any) -> Path:
    lines = FIXTURE.read_text().splitlines()
    header = json.loads(lines[0])
    header.update(changes)
    out = tmp_path / "rec.jsonl"
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return out


def _report(path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "llmtop", "report", str(path), "--format",
                           "json", "-q"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _requests() -> int:
    """The request lines of the fixture."""
    return sum(json.loads(ln)["type"] == "request" for ln in FIXTURE.read_text().splitlines())


@pytest.mark.parametrize("started_at", [1e300, 1e17])
def test_a_start_time_past_any_clock_is_ignored_and_said(tmp_path: Path,
                                                         started_at: float) -> None:
    rep = _report(_with_header(tmp_path, started_at=started_at))
    c = rep["conditions"]
    assert c["requests"] == _requests() > 0 and c["started_at"] is None
    assert 0 < c["duration_s"] < 60
    assert any("started_at" in p and "ignored" in p for p in rep["source"]["problems"])


def test_a_start_a_year_before_the_first_request_does_not_stretch_the_report(
        tmp_path: Path) -> None:
    base = _report(FIXTURE)
    early = _report(_with_header(tmp_path, started_at=base["conditions"]["started_at"]
                                 - 365 * 86400.0))
    assert early["conditions"]["requests"] == base["conditions"]["requests"]
    # the report starts at the first request, not a year of empty seconds before it
    assert early["conditions"]["duration_s"] <= base["conditions"]["duration_s"] + 1.0
    assert len(early["series"]) <= len(base["series"]) + 2


def test_request_times_past_any_clock_are_bad_lines(tmp_path: Path) -> None:
    """Every time of the recording 1e17 s on and no start in its header: the lines agree
    with each other, so only the bound on times tells them from real ones (the replay of
    them stood still, as for the header above)."""
    lines = []
    for ln in FIXTURE.read_text().splitlines():
        d = json.loads(ln)
        d.pop("started_at", None)
        if "t_start" in d:
            d["t_start"] += 1e17
        lines.append(json.dumps(d))
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rep = _report(path)
    assert rep["source"]["bad_lines"] == _requests() > 0
    assert rep["conditions"]["requests"] == 0


@pytest.mark.parametrize("later_by", [2 * 86400.0, 365 * 86400.0])
def test_a_start_after_every_event_is_ignored_not_the_events(tmp_path: Path,
                                                             later_by: float) -> None:
    """A header whose started_at is days after every line (a damaged digit): each line was
    'more than a day before the recording started', a bad line, and the report was
    empty. The lines agree with each other; the header alone is wrong."""
    base = _report(FIXTURE)
    rep = _report(_with_header(tmp_path, started_at=base["conditions"]["started_at"]
                               + later_by))
    c = rep["conditions"]
    assert c["requests"] == base["conditions"]["requests"] == _requests() > 0
    assert rep["source"]["bad_lines"] == 0 and c["started_at"] is None
    assert c["duration_s"] <= base["conditions"]["duration_s"] + 1.0
    assert rep["source"]["problems"][0] == (
        "line 1: header started_at is more than a day after the events; ignored")


def test_one_event_a_day_before_the_start_is_still_a_bad_line(tmp_path: Path) -> None:
    """An outlier before the start, followed by events near it: the outlier goes."""
    lines = FIXTURE.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "request")
    d = json.loads(lines[first])
    d["t_start"] -= 3 * 86400.0
    lines[first] = json.dumps(d)
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rep = _report(path)
    assert rep["source"]["bad_lines"] == 1
    assert rep["conditions"]["requests"] == _requests() - 1
    assert rep["source"]["problems"] == [
        f"line {first + 1}: request: t_start is more than a day before the recording started"]


def test_hlog_of_a_start_after_every_event_keeps_its_intervals(tmp_path: Path) -> None:
    """export --hlog took the header's start as its base before reading: every request
    fell in interval 0 (one interval per tag) even once the reader had found it wrong."""
    from llmtop.recording.hlog import export_hlog

    base = json.loads(FIXTURE.read_text().split("\n", 1)[0])["started_at"]
    want = export_hlog(FIXTURE, tmp_path / "a.hlog", interval_s=1.0)
    assert want["ttft"] > 3
    got = export_hlog(_with_header(tmp_path, started_at=base + 2 * 86400.0),
                      tmp_path / "b.hlog", interval_s=1.0)
    # (from the first request's start, not the header's: the intervals may split a
    # second otherwise, one more or fewer)
    assert got.keys() == want.keys()
    assert all(abs(got[k] - want[k]) <= 1 for k in want), (got, want)


def test_a_defaulted_request_before_a_wrong_start_keeps_its_line_number(
        tmp_path: Path) -> None:
    from llmtop.recording.reader import RecordingReader

    lines = FIXTURE.read_text().splitlines()
    header = json.loads(lines[0])
    header["started_at"] += 3 * 86400.0
    lines[0] = json.dumps(header)
    first = next(i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "request")
    d = json.loads(lines[first])
    del d["dialect"]
    lines[first] = json.dumps(d)
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with RecordingReader(path) as r:
        assert sum(1 for _ in r) == len(lines) - 1  # every event (all but the header)
        assert r.defaulted_lines == 1 and r.bad_lines == 0
        assert f"line {first + 1}: request lacks fields; read with their defaults" in r.problems
