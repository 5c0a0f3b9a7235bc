"""The report's rates against hand-computed figures: throughput, goodput and per-user tok/s
divide by the recording's own span (its start to its last event — they used to run on to a
tick or two past the end), and the arrival rates agree with them (the mean used to exceed
the 10 s peak)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, session, write_recording

from llmtop.events import RequestRecord
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.text import render_text

T0 = 1_796_000_000.6  # not on a whole second: windows and ticks are aligned to those
SLO = {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}
# (user, start offset): each request 10 tokens in 10 chunks, TTFT 0.2 s, E2E 0.381 s
PLAN = [("alice", 0.5), ("alice", 1.0), ("alice", 1.5), ("alice", 2.0), ("bob", 3.0),
        ("bob", 3.2), ("alice", 7.9)]
E2E = 0.2 + 9 * 0.02 + 0.001
SPAN = 7.9 + E2E  # the header's start to the last request's end


def _recording(path: Path, *, footer_at: float | None) -> list[RequestRecord]:
    recs = [request(i, T0 + off, user=user, ttft=0.2, gap=0.02, n_chunks=10)
            for i, (user, off) in enumerate(PLAN)]
    lines: list[dict[str, Any]] = [{"type": "header", "format": "llmtop-recording",
                                    "version": 1, "started_at": T0, "upstream": "http://u",
                                    "slo": SLO, "llmtop_version": "test"}]
    lines += [r.to_json_dict() for r in sorted(recs, key=lambda r: r.t_start + r.e2e_s)]
    if footer_at is not None:  # the recorder stopped a while after the last request
        lines.append({"type": "footer", "ended_at": T0 + footer_at, "requests": len(recs)})
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return recs


@pytest.mark.parametrize("footer_at", [None, 9.0], ids=["killed", "stopped"])
def test_rates_divide_by_the_recordings_span(tmp_path: Path, footer_at: float | None) -> None:
    recs = _recording(tmp_path / "r.jsonl", footer_at=footer_at)
    assert all(r.completion_tokens == 10 and r.e2e_s == pytest.approx(E2E) for r in recs)
    r = analyse(tmp_path / "r.jsonl")
    assert r["conditions"]["duration_s"] == pytest.approx(SPAN)
    th = r["throughput"]
    assert th["span_s"] == pytest.approx(SPAN)  # was 10.0 (ticks to 9 s, + one)
    assert th["output_tokens"] == 70 and th["input_tokens"] == 700
    assert th["output_tps"] == pytest.approx(70 / SPAN)  # 8.45 tok/s, not 7.0
    assert th["input_tps"] == pytest.approx(700 / SPAN)
    assert th["rps"] == pytest.approx(7 / SPAN)
    s = r["slo"]
    assert s["attainment"] == 1.0
    assert s["goodput_tps"] == pytest.approx(70 / SPAN)
    assert s["goodput_rps"] == pytest.approx(7 / SPAN)
    users = {u["user"]: u for u in r["users"]}
    assert users["alice"]["output_tps"] == pytest.approx(50 / SPAN)
    assert users["bob"]["output_tps"] == pytest.approx(20 / SPAN)
    # the percentiles and counts are the aggregator's, as before
    assert r["latency"]["ttft"]["count"] == 7 and r["latency"]["ttft"]["p50"] == \
        pytest.approx(0.2, rel=1e-3)
    text = render_text(r)
    assert f"  system output   {70 / SPAN:.1f} tok/s mean" in text
    assert "  over            8.3s, the recording's start to its last event" in text


def test_arrivals_by_hand(tmp_path: Path) -> None:
    _recording(tmp_path / "r.jsonl", footer_at=None)
    r = analyse(tmp_path / "r.jsonl")
    a = r["conditions"]["arrival"]
    assert a["rps_mean"] == pytest.approx(7 / SPAN) == r["throughput"]["rps"]
    # one 10 s window: the whole 8.28 s
    assert a["rps_peak_10s"] == pytest.approx(7 / SPAN)
    assert a["rps_peak_1s"] == 2.0  # +1.0/+1.5 and +3.0/+3.2
    # whole seconds 0..6 hold 1, 2, 1, 2, 0, 0, 0 arrivals: variance/mean = (34/49)/(6/7)
    assert a["dispersion_index"] == pytest.approx(34 / 42)
    assert (f"  arrivals        {7 / SPAN:.2f} req/s mean, busiest 10 s {7 / SPAN:.2f} req/s, "
            "busiest second 2.0 req/s; dispersion 0.81") in render_text(r)


def test_arrival_peaks_never_undercut_the_mean(tmp_path: Path) -> None:
    """A burst early in a recording that runs on (the QA case: 16 requests in 5 s of an
    8.1 s recording read '3.20 req/s mean, peak 1.6 req/s (10 s)')."""
    lines: list[dict[str, Any]] = [{"type": "header", "format": "llmtop-recording",
                                    "version": 1, "started_at": T0, "slo": SLO}]
    recs = [request(i, T0 + 0.3 * i) for i in range(16)]
    lines += [x.to_json_dict() for x in recs]
    lines.append({"type": "engine", "t": T0 + 8.1, "kind": "sim"})
    (tmp_path / "k.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    r = analyse(tmp_path / "k.jsonl")
    a = r["conditions"]["arrival"]
    assert r["throughput"]["span_s"] == pytest.approx(8.1)
    assert a["rps_mean"] == pytest.approx(16 / 8.1) == r["throughput"]["rps"]
    assert a["rps_mean"] <= a["rps_peak_10s"] <= a["rps_peak_1s"]
    # longer sessions: a last partial window joins the one before it
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, session(200, duration_s=45, seed=3))
    r = analyse(path)
    a = r["conditions"]["arrival"]
    assert a["rps_mean"] == pytest.approx(r["throughput"]["rps"])
    assert a["rps_mean"] <= a["rps_peak_10s"] <= a["rps_peak_1s"]
