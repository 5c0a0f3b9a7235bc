"""A recording started mid-traffic says that its rates undercount (QA hunt: report vs
recording).

A recording started with ``POST /llmtop/v1/recording`` while requests are in flight (or
a rotated part read alone) holds requests that began before it did. The report's figures
ran from the first of those starts, but the requests that ended before the recording
began are not in it: a sim run at 129 tok/s, recorded from 2.6 s in, read "88.1 tok/s"
with nothing to say why. The report counts those requests and says so (text, HTML, a
comparison's notes); its rates run from the recording's start and count only the tokens
streamed after it (``test_recording_mid_traffic_rates`` checks them against a real
client). Recordings are written by the real recorder.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord


def write(path: Path, recs: list[RequestRecord]) -> None:
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, events)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(["report", *argv, "-q"]) == 0
    return capsys.readouterr().out


def test_requests_begun_before_the_recording_are_counted_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    # three streams open when the recorder starts (begun 3 s before), then a steady run
    early = [request(i, now - 3.0, ttft=0.1, gap=0.05, n_chunks=120) for i in range(3)]
    later = [request(10 + i, soon() + i) for i in range(10)]
    mid = tmp_path / "mid.jsonl"
    write(mid, early + later)
    header = json.loads(mid.read_text().splitlines()[0])
    assert all(r.t_start < header["started_at"] < r.t_start + r.e2e_s for r in early)

    r = json.loads(run(capsys, str(mid), "--format", "json"))
    c = r["conditions"]
    assert c["requests_before_start"] == 3
    assert c["first_start_at"] == pytest.approx(now - 3.0)
    # the rates: the recording's span, and the early streams' chunks from its start on
    started = header["started_at"]
    after = sum(1 for e in early for off in e.chunk_offsets_s if e.t_start + off >= started)
    assert 0 < after < 3 * 120
    th = r["throughput"]
    assert th["output_tokens"] == after + 10 * 10
    assert th["input_tokens"] == 10 * 100  # the early prompts went before the start
    assert th["span_s"] == pytest.approx(c["last_event_at"] - started)
    assert th["output_tps"] == pytest.approx((after + 100) / th["span_s"])
    text = run(capsys, str(mid))
    note = next(x for x in text.splitlines() if x.strip().startswith("note"))
    assert "3 requests began before the recording did" in note
    assert "count only the tokens streamed after it" in note
    html = run(capsys, str(mid), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert html == ""
    assert "3 requests began before the recording did" in (tmp_path / "r.html").read_text()

    plain = tmp_path / "plain.jsonl"
    write(plain, [request(20 + i, soon() + i) for i in range(10)])
    assert json.loads(run(capsys, str(plain), "--format", "json"))[
        "conditions"]["requests_before_start"] == 0
    assert "began before" not in run(capsys, str(plain))
    cmp = json.loads(run(capsys, str(plain), str(mid), "--format", "json"))
    assert any(n.startswith("B: 3 requests began before") for n in cmp["notes"])
    assert not any(n.startswith("A:") and "began before" in n for n in cmp["notes"])
