"""When two recordings' idle time around their load differs, their rates over the whole
recording are withheld (abad33f); the comparison now gives a throughput that can be
compared: 'output tok/s while busy', the output over the time the requests ran (the
first one's start to the last one's end). A faster server under the same closed loop,
recorded after the same wait, used less of its recording: its rates over the recording
were withheld and no throughput ratio was left (llmtop sim at time_scale 1 and 0.6 behind
llmtop run --record: 164.9 and 274.8 tok/s while busy, the 1.67x bench measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main


def closed_loop(path: Path, *, gap: float, lead_s: float, clients: int = 4,
                n: int = 80) -> Path:
    t0 = soon() + lead_s
    recs: list[Any] = []
    for w in range(clients):
        t = t0 + w * 0.013
        for _ in range(n // clients):
            r = request(len(recs), t, ttft=0.2, gap=gap, n_chunks=20, tokens_per_chunk=2,
                        concurrency=clients)
            recs.append(r)
            t += r.e2e_s + 0.001
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s))
    return path


def by_hand(path: Path) -> float:
    reqs = [json.loads(line) for line in path.read_text().splitlines()
            if '"type":"request"' in line]
    busy = (max(r["t_start"] + r["e2e_s"] for r in reqs) - min(r["t_start"] for r in reqs))
    return sum(r["completion_tokens"] for r in reqs) / busy


def test_the_busy_rate_compares_where_the_span_rates_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = closed_loop(tmp_path / "a.jsonl", gap=0.03, lead_s=10.0)
    b = closed_loop(tmp_path / "b.jsonl", gap=0.01, lead_s=10.0)  # faster: less of its span
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q", "--format", "json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    rows = {r["figure"]: r for r in cmp["figures"]}
    assert rows["system output tok/s"]["withheld"]  # the idle shares differ
    busy = rows["output tok/s while busy"]
    assert busy["a"] == pytest.approx(by_hand(a), rel=1e-9)
    assert busy["b"] == pytest.approx(by_hand(b), rel=1e-9)
    assert busy["ratio_b_over_a"] == pytest.approx(by_hand(b) / by_hand(a), rel=1e-9)
    assert busy["ratio_b_over_a"] > 1.4
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q"]) == 0
    out = capsys.readouterr().out
    assert "(output tok/s while busy is over the requests' own time)" in out
    assert any(line.startswith("  output tok/s while busy") and line.endswith("×")
               for line in out.splitlines())
