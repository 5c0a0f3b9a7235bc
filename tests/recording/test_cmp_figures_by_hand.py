"""Every figure ``llmtop report`` gives, and a comparison's columns, checked against an
independent computation from the recording's own lines (read here as plain JSON, not by
llmtop's reader): percentiles by the HDR rule (the sample at rank q * n rounded half up, within
0.1% as 3 significant digits allow), tokens/s over the stated span (the header's start to
the last event), SLO attainment and goodput by domain.md's definitions, per-user rows.
Then: a second run of the same workload compares (ratios given), one under another load
withholds them and says why; and ``export --parquet`` holds the lines' rows and values."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main

SLO = {"ttft_s": 0.12, "itl_p95_s": 0.02, "target": 0.9}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hdr(values: list[float], q: float) -> float:
    """HdrHistogram's rule (getValueAtPercentile): the sample at rank q * n rounded half
    up (1-based, at least 1) of the sorted samples."""
    s = sorted(values)
    return s[max(1, math.floor(q * len(s) + 0.5)) - 1]


def close_hdr(got: float, want: float) -> bool:
    return abs(got - want) <= want * 1e-3 + 2e-6  # 3 significant digits, µs units


def itl_samples(r: dict[str, Any]) -> list[float]:
    """domain.md: a chunk of k tokens after a gap g gives k samples of g / k."""
    offs, toks = r["chunk_offsets_s"], r.get("chunk_tokens") or [1] * len(r["chunk_offsets_s"])
    out: list[float] = []
    for i in range(1, len(offs)):
        k = max(1, toks[i])
        out += [(offs[i] - offs[i - 1]) / k] * k
    return out


def met(r: dict[str, Any]) -> bool:
    if r["outcome"] != "ok":
        return False
    if r["ttft_s"] is None or r["ttft_s"] > SLO["ttft_s"]:
        return False
    itl = itl_samples(r)
    return not itl or hdr(itl, 0.95) <= SLO["itl_p95_s"] * (1 + 1e-3)


def by_hand(path: Path) -> dict[str, Any]:
    ls = lines(path)
    header = ls[0]
    reqs = [d for d in ls if d["type"] == "request"]
    ends = [d["t_start"] + d["e2e_s"] if d["type"] == "request" else d["t"]
            for d in ls if d["type"] not in ("header", "footer")]
    span = max(ends) - header["started_at"]
    tokens = sum(d["completion_tokens"] or 0 for d in reqs)
    judged = [d for d in reqs if d["outcome"] in ("ok", "error", "timeout")]
    good = [d for d in judged if met(d)]
    users: dict[str, dict[str, Any]] = {}
    for d in reqs:
        u = users.setdefault(d["user"], {"requests": 0, "tokens": 0, "met": 0, "judged": 0,
                                         "bad": 0})
        u["requests"] += 1
        u["tokens"] += d["completion_tokens"] or 0
        u["judged"] += d in judged
        u["met"] += d in good
        u["bad"] += d["outcome"] in ("error", "timeout")
    return {
        "span": span, "n": len(reqs),
        "ttft": [d["ttft_s"] for d in reqs if d["ttft_s"] is not None],
        "e2e": [d["e2e_s"] for d in reqs if d["outcome"] == "ok"],  # (as live: ok only)
        "itl": [x for d in reqs for x in itl_samples(d)],
        "output_tps": tokens / span, "rps": len(reqs) / span,
        "attainment": len(good) / len(judged),
        "goodput_tps": sum(d["completion_tokens"] or 0 for d in good) / span,
        "goodput_rps": len(good) / span,
        "users": users,
    }


def report_json(capsys: pytest.CaptureFixture[str], *paths: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", *map(str, paths), "-q", "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def make(path: Path, *, seed: int, max_conc: int = 8, n: int = 300) -> Path:
    write_recording(path, session(n, seed=seed, max_conc=max_conc, duration_s=30.0),
                    header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    return path


def test_every_figure_agrees_with_the_lines(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = make(tmp_path / "a.jsonl", seed=1)
    want = by_hand(path)
    r = report_json(capsys, path)
    th = r["throughput"]
    assert th["span_s"] == pytest.approx(want["span"], abs=1e-6)
    assert th["output_tps"] == pytest.approx(want["output_tps"], rel=1e-9)
    assert th["rps"] == pytest.approx(want["rps"], rel=1e-9)
    assert r["conditions"]["requests"] == want["n"]
    for key in ("ttft", "itl", "e2e"):
        for q in (0.5, 0.9, 0.95, 0.99):
            got = r["latency"][key][f"p{round(q * 100)}"]
            assert close_hdr(got, hdr(want[key], q)), (key, q, got, hdr(want[key], q))
        assert close_hdr(r["latency"][key]["max"], max(want[key]))
    s = r["slo"]
    assert 0 < want["attainment"] < 1  # the session crosses its objectives: a real test
    assert s["attainment"] == pytest.approx(want["attainment"], rel=1e-12)
    assert s["goodput_tps"] == pytest.approx(want["goodput_tps"], rel=1e-9)
    assert s["goodput_rps"] == pytest.approx(want["goodput_rps"], rel=1e-9)
    assert {u["user"] for u in r["users"]} == set(want["users"])
    for u in r["users"]:
        h = want["users"][u["user"]]
        assert u["requests"] == h["requests"]
        assert u["output_tps"] == pytest.approx(h["tokens"] / want["span"], rel=1e-9)
        assert u["slo_attainment"] == pytest.approx(h["met"] / h["judged"], rel=1e-12)
        assert u["errors"] + u["timeouts"] == h["bad"]


def test_same_workload_twice_compares_and_other_load_withholds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = make(tmp_path / "a.jsonl", seed=1)
    b = make(tmp_path / "b.jsonl", seed=2)  # the same workload, another run of it
    c = make(tmp_path / "c.jsonl", seed=1, max_conc=24)  # three times the concurrency
    ab = report_json(capsys, a, b)
    assert ab["conditions_match"] and not ab["warnings"]
    ra, rb = by_hand(a), by_hand(b)
    rows = {row["figure"]: row for row in ab["figures"]}
    assert rows["system output tok/s"]["a"] == pytest.approx(ra["output_tps"], rel=1e-9)
    assert rows["system output tok/s"]["ratio_b_over_a"] == pytest.approx(
        rb["output_tps"] / ra["output_tps"], rel=1e-9)
    assert rows["SLO attainment"]["ratio_b_over_a"] == pytest.approx(
        rb["attainment"] / ra["attainment"], rel=1e-9)
    assert close_hdr(rows["TTFT p95"]["b"], hdr(rb["ttft"], 0.95))
    ac = report_json(capsys, a, c)
    assert not ac["conditions_match"]
    assert any(w.startswith("different concurrency ranges") for w in ac["warnings"])
    assert all(row["ratio_b_over_a"] is None and row["withheld"] for row in ac["figures"])
    capsys.readouterr()
    assert main(["report", str(a), str(c), "-q"]) == 0
    out = capsys.readouterr().out
    assert "ratios are withheld" in out and "! different concurrency ranges: A 1–8" in out


def test_parquet_holds_the_lines(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path = make(tmp_path / "a.jsonl", seed=3, n=120)
    assert main(["export", str(path), "--parquet", str(tmp_path / "pq"), "-q"]) == 0
    ls = lines(path)
    reqs = [d for d in ls if d["type"] == "request"]
    t = pq.read_table(tmp_path / "pq" / "requests.parquet").to_pylist()
    assert len(t) == len(reqs)
    by_id = {row["id"]: row for row in t}
    for d in reqs:
        row = by_id[d["id"]]
        for k in ("user", "model", "outcome", "status", "prompt_tokens", "completion_tokens"):
            assert row[k] == d[k], (k, row[k], d[k])
        for k in ("t_start", "ttft_s", "e2e_s"):
            assert (row[k] is None and d[k] is None) or row[k] == pytest.approx(d[k], abs=1e-6)
    gpu = pq.read_table(tmp_path / "pq" / "gpu.parquet")
    assert gpu.num_rows == sum(d["type"] == "gpu" for d in ls)


AXES = {  # each plot's axis titles, as its SVG's text
    "plot-latency-time": ("TTFT (ms)", "ITL (ms)", "seconds since start"),
    "plot-throughput-time": ("tokens / s", "requests in flight", "seconds since start"),
    "plot-knee": ("TTFT p95 (ms)", "ITL p95 (ms)", "system output tok/s at that concurrency"),
    "plot-distributions": ("samples", "TTFT (ms, log scale)", "ITL (ms, log scale)"),
    "plot-users": ("output tok/s (session mean)", "TTFT p95 (ms)"),
    "plot-gpu": ("memory (GiB)", "% of peak", "seconds since start"),
    "plot-compare-knee": ("TTFT p95 (ms)", "system output tok/s at that concurrency"),
}


def self_contained(page: str) -> None:
    """Nothing the browser would fetch: no script, link, image or frame element, no
    @import, every url() a fragment of the page, no http(s) address but the SVG
    namespaces and the recordings' upstream."""
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", page)
    assert "@import" not in page and not re.search(r"url\((?!#)", page)
    addresses = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert addresses <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink",
                         "http://127.0.0.1:9/v1"}, addresses


def test_html_is_self_contained_and_its_plots_have_labelled_axes(tmp_path: Path) -> None:
    a = make(tmp_path / "a.jsonl", seed=1)
    b = make(tmp_path / "b.jsonl", seed=2)
    for name, files in (("one", [a]), ("two", [a, b])):
        out = tmp_path / f"{name}.html"
        assert main(["report", *map(str, files), "-q", "--format", "html", "-o", str(out)]) == 0
        page = out.read_text()
        self_contained(page)
        plots = dict(re.findall(r'<figure data-plot="([^"]+)"(.*?)</figure>', page, re.S))
        assert plots, "no plot"
        for plot_id, body in plots.items():
            texts = set(re.findall(r"<text[^>]*>([^<]*)</text>", body))
            for label in AXES[plot_id]:
                assert any(t.startswith(label) for t in texts), (plot_id, label, texts)
