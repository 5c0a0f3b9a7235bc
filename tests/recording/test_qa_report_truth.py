"""`llmtop report` checked against figures computed here, independently, from the records
(QA "does the report tell the truth"). Recordings are written by the real recorder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord


def report_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_peak_output_rate_of_a_short_recording_is_not_below_its_mean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 5 s of traffic, the busiest part last (after the last whole 2 s step): the only
    # 10 s window there is is the whole recording, so its peak rate is its mean
    t0 = time.time() + 0.5  # just after the recorder's start (its header's started_at)
    recs: list[RequestRecord] = [request(i, t0 + 0.5 * i, ttft=0.1, gap=0.02, n_chunks=10)
                                 for i in range(4)]
    recs += [request(10 + i, t0 + 4.2, ttft=0.1, gap=0.01, n_chunks=50, tokens_per_chunk=2,
                     concurrency=8, user=f"u{i}") for i in range(8)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    path = tmp_path / "short.jsonl"
    write_recording(path, events)
    header = json.loads(path.read_text().splitlines()[0])
    tokens = sum(r.completion_tokens or 0 for r in recs)
    span = max(r.t_start + r.e2e_s for r in recs) - header["started_at"]
    assert span < 10
    r = report_json(capsys, path)
    th = r["throughput"]
    assert th["output_tokens"] == tokens
    assert th["output_tps"] == pytest.approx(tokens / span, rel=1e-6)
    assert th["output_tps_peak"] == pytest.approx(tokens / span, rel=1e-6)
    assert th["output_tps_peak"] >= th["output_tps"] - 1e-9
