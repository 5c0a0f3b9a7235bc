"""The report's list of errors: errors and timeouts only, and what the top five leave out
is counted (QA: "errors 21" above a list that showed 3 "client disconnected" — cancels —
and silently left out 6 malformed-stream errors)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main


def test_error_list_has_no_cancels_and_counts_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = soon()
    recs = [request(i, t0 + i * 0.1) for i in range(5)]
    recs += [dataclasses.replace(request(10 + i, t0 + 1 + i * 0.1, outcome="cancelled"),
                                 status=200, error="client disconnected") for i in range(3)]
    kinds = [f"upstream answered HTTP {500 + k}" for k in range(7)]  # 7 kinds, 1 each…
    recs += [dataclasses.replace(request(20 + i, t0 + 2 + i * 0.1, outcome="error"),
                                 error=kinds[i]) for i in range(7)]
    recs += [dataclasses.replace(request(40 + i, t0 + 3 + i * 0.1, outcome="error"),
                                 error=kinds[0]) for i in range(2)]  # …the first 3
    path = tmp_path / "r.jsonl"
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s))
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    o = json.loads(capsys.readouterr().out)["outcomes"]
    listed = {e["error"]: e["count"] for e in o["top_errors"]}
    assert "client disconnected" not in listed and len(listed) == 5
    assert listed[kinds[0]] == 3
    assert sum(listed.values()) + o["other_errors"] == o["errors"] == 9
    assert main(["report", str(path), "-q"]) == 0
    text = capsys.readouterr().out
    assert "2 × other errors" in text and "client disconnected" not in text
