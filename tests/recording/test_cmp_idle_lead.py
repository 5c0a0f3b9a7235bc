"""The same load recorded twice, once after a longer wait (a proxy started, then the
benchmark some seconds later), compares: its arrival rate is judged over the time its
requests ran, not over the whole recording, so the latency and error ratios are given;
the rates over each recording's whole span (tok/s, req/s, goodput) differ by the idle
time alone and are the ones withheld, with a note saying so. Before, the comparison read
'different arrival rates' and withheld every ratio (llmtop run + llmtop sim + llmtop
bench, 40 requests at concurrency 4 after 2.5 s and 12 s: 3.81 and 2.02 req/s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import session, soon, write_recording

from llmtop.cli import main
from llmtop.recording.report.compare import arrival_rate

SPAN_RATES = {"system output tok/s", "requests/s", "goodput tok/s"}


def make(path: Path, *, seed: int, lead_s: float) -> Path:
    # the recorder starts now; the load begins lead_s later and runs 30 s
    write_recording(path, session(300, seed=seed, duration_s=30.0, t0=soon() + lead_s))
    return path


def compare(capsys: pytest.CaptureFixture[str], a: Path, b: Path,
            fmt: str = "json") -> Any:
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q", "--format", fmt]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else out


def test_the_same_load_after_a_longer_wait_compares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = make(tmp_path / "a.jsonl", seed=1, lead_s=0.0)
    b = make(tmp_path / "b.jsonl", seed=2, lead_s=25.0)
    cmp = compare(capsys, a, b)
    assert cmp["conditions_match"], cmp["warnings"]
    rows = {r["figure"]: r for r in cmp["figures"]}
    for label in ("TTFT p95", "ITL p95", "E2E p99", "SLO attainment", "error rate"):
        assert rows[label]["ratio_b_over_a"] is not None, label
        assert not rows[label]["withheld"]
    for label in SPAN_RATES:  # 30 s of load in ~40 s and in ~65 s: idle time, no ratio
        assert rows[label]["withheld"] and rows[label]["ratio_b_over_a"] is None, label
    assert any("idle time before or after the load" in n for n in cmp["notes"])
    text = compare(capsys, a, b, "text")
    assert "ratios are withheld" not in text and "different arrival rates" not in text
    assert "of B's (idle time before or after the load)" in text


def test_a_busier_load_is_still_told(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    a = make(tmp_path / "a.jsonl", seed=1, lead_s=0.0)
    b = tmp_path / "b.jsonl"  # twice the requests in the same 30 s, at once
    write_recording(b, session(600, seed=2, duration_s=30.0, t0=soon()))
    cmp = compare(capsys, a, b)
    assert any(w.startswith("different arrival rates") for w in cmp["warnings"])
    assert all(r["ratio_b_over_a"] is None for r in cmp["figures"])


def test_the_same_wait_gives_every_ratio(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a = make(tmp_path / "a.jsonl", seed=1, lead_s=5.0)
    b = make(tmp_path / "b.jsonl", seed=2, lead_s=5.0)
    cmp = compare(capsys, a, b)
    assert cmp["conditions_match"]
    assert all(r["ratio_b_over_a"] is not None for r in cmp["figures"]
               if isinstance(r["a"], int | float) and isinstance(r["b"], int | float)
               and r["a"])


def test_without_a_busy_rate_the_mean_is_compared() -> None:
    # a busy time of none (every request took no time) or a report from before it
    assert arrival_rate({"arrival": {"rps_mean": 3.0, "rps_busy": None}}) == 3.0
    assert arrival_rate({"arrival": {"rps_mean": 3.0}}) == 3.0
    assert arrival_rate({"arrival": {"rps_mean": 3.0, "rps_busy": 5.0}}) == 5.0
