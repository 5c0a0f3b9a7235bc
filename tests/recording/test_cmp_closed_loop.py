"""Two server configurations under the same closed-loop benchmark (bench --concurrency 4:
each client sends its next request when its last one ends) compare: the faster one
answers more requests a second, which is its result, not another workload. Before,
'different arrival rates' withheld every ratio (llmtop sim with time_scale 1 and 0.6
behind llmtop run --record, 40 requests at concurrency 4: 5.15 and 8.59 req/s, so the
0.60x TTFT went unsaid). Open-loop arrivals at other rates are still another workload."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main


def closed_loop(path: Path, *, gap: float, clients: int = 4, n: int = 80,
                header: dict[str, Any] | None = None) -> Path:
    """``clients`` workers, each sending its next request 1 ms after its last one ended;
    ``gap`` sets the server's speed (20 chunks: E2E about 0.2 + 19 gap)."""
    t0 = soon()
    recs: list[Any] = []
    for w in range(clients):
        t = t0 + w * 0.013
        for _ in range(n // clients):
            r = request(len(recs), t, ttft=0.2, gap=gap, n_chunks=20, concurrency=clients)
            recs.append(r)
            t += r.e2e_s + 0.001
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s), header=header)
    return path


def open_loop(path: Path, *, rate: float, n: int = 200, seed: int = 1) -> Path:
    """Poisson arrivals at ``rate`` (each recorded at concurrency 4, so that only the
    arrival rate differs)."""
    rnd, t = random.Random(seed), soon()
    recs: list[Any] = []
    for i in range(n):
        t += rnd.expovariate(rate)
        recs.append(request(i, t, ttft=0.2, gap=0.02, n_chunks=20, concurrency=4))
    recs.sort(key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, recs)
    return path


def compare(capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q", "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_a_faster_server_under_the_same_closed_loop_compares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = closed_loop(tmp_path / "a.jsonl", gap=0.03)  # E2E ~0.77 s
    b = closed_loop(tmp_path / "b.jsonl", gap=0.015)  # E2E ~0.49 s: 1.6x the requests/s
    cmp = compare(capsys, a, b)
    assert cmp["conditions_match"], cmp["warnings"]
    rows = {r["figure"]: r for r in cmp["figures"]}
    assert rows["E2E p50"]["ratio_b_over_a"] == pytest.approx(0.49 / 0.77, rel=0.05)
    assert rows["ITL p50"]["ratio_b_over_a"] == pytest.approx(0.5, rel=0.02)
    note = next(n for n in cmp["notes"] if n.startswith("arrival rates"))
    assert "both closed loops" in note and "the load compared is their concurrency" in note


def test_a_bench_header_says_closed_loop(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bench = {"upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5}, "source": "bench",
             "bench": {"mode": "concurrency", "levels": [4], "arrivals": "closed-loop"}}
    a = open_loop(tmp_path / "a.jsonl", rate=4.0)  # spaced, but its header says closed
    b = open_loop(tmp_path / "b.jsonl", rate=8.0)
    for p in (a, b):
        lines = p.read_text().splitlines()
        head = json.loads(lines[0])
        head.update({k: v for k, v in bench.items() if k not in ("upstream", "slo")})
        p.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    assert compare(capsys, a, b)["conditions_match"]


def test_open_loops_at_other_rates_are_another_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = open_loop(tmp_path / "a.jsonl", rate=4.0)
    b = open_loop(tmp_path / "b.jsonl", rate=8.0)
    cmp = compare(capsys, a, b)
    assert any(w.startswith("different arrival rates") for w in cmp["warnings"])
    assert all(r["ratio_b_over_a"] is None for r in cmp["figures"])


def test_after_end_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = closed_loop(tmp_path / "c.jsonl", gap=0.02)
    opened = open_loop(tmp_path / "o.jsonl", rate=5.0)
    shares = []
    for p in (closed, opened):
        capsys.readouterr()
        assert main(["report", str(p), "-q", "--format", "json"]) == 0
        shares.append(json.loads(capsys.readouterr().out)["conditions"]["arrival"]
                      ["after_end_share"])
    assert shares[0] == pytest.approx(1 - 4 / 80)  # all but each client's first
    assert shares[1] < 0.15
