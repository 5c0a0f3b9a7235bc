"""`llmtop report`'s latency-by-concurrency rows count errors as the report's outcomes do
(QA hunt: report vs recording).

Each row's ``errors`` was every request that was not ``ok``: cancellations (which the
report counts as no error: a client that left) and timeouts too. A recording with 12
errors and 4 cancellations had rows whose errors summed to 16 beside ``outcomes.errors``
12. Recordings are written by the real recorder and read back by ``llmtop report``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event


def test_rows_split_errors_timeouts_and_cancellations(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = soon()
    outcomes = ["ok"] * 5 + ["cancelled"] * 3 + ["error"] * 2 + ["timeout"]
    recs = [request(i, t0 + i, outcome=o, concurrency=1 + i % 2)
            for i, o in enumerate(outcomes)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    path = tmp_path / "mixed.jsonl"
    write_recording(path, events)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    r = json.loads(capsys.readouterr().out)
    rows = r["by_concurrency"]
    o = r["outcomes"]
    assert (o["errors"], o["timeouts"], o["cancelled"]) == (2, 1, 3)
    for key in ("errors", "timeouts", "cancelled"):
        assert sum(row[key] for row in rows) == o[key]
    for row in rows:
        mine = [x for x in recs if x.concurrency_at_start == row["concurrency"]]
        assert row["requests"] == len(mine)
        assert row["errors"] == sum(x.outcome == "error" for x in mine)
        assert row["timeouts"] == sum(x.outcome == "timeout" for x in mine)
        assert row["cancelled"] == sum(x.outcome == "cancelled" for x in mine)


def test_series_points_split_errors_and_timeouts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The time series' points counted errors and timeouts as one "errors": the same
    word meant three things in one report. Each point now has both, as the outcomes."""
    t0 = soon()
    outcomes = ["ok"] * 5 + ["error"] * 2 + ["timeout"] * 3
    recs = [request(i, t0 + i, outcome=o) for i, o in enumerate(outcomes)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    path = tmp_path / "series.jsonl"
    write_recording(path, events)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    r = json.loads(capsys.readouterr().out)
    last = r["series"][-1]
    assert (last["errors"], last["timeouts"]) == (2, 3), last
