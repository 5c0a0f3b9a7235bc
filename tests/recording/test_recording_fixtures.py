"""Recordings made by an earlier build (tests/fixtures/recordings/, from make_fixtures.py:
the simulator behind the proxy, concurrency stepping 1 → 8) keep reading, replaying,
reporting and exporting — the version-1 format is an outside interface."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent
from llmtop.recording.parquet import export_parquet
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplayEngine
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.text import render_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
RAMP = FIXTURES / "sim_tiny_ramp.jsonl.gz"
SHORT = FIXTURES / "sim_tiny_short.jsonl"


def test_fixtures_read_back() -> None:
    with RecordingReader(RAMP) as r:
        assert r.header["version"] == 1 and r.header["slo"]["ttft_s"] == 0.25
        kinds: dict[type, int] = {}
        for e in r:
            kinds[type(e)] = kinds.get(type(e), 0) + 1
        assert r.complete and r.bad_lines == 0 and r.truncated_lines == 0
    assert kinds[RequestRecord] == 181
    assert kinds[GpuReading] > 20 and kinds[EngineReading] > 20 and kinds[WarningEvent] >= 2
    with RecordingReader(SHORT) as r:
        recs = list(r)
        assert len(recs) == 30 and r.footer is None  # cut: no footer, still fine


def test_fixture_report_and_replay(tmp_path: Path) -> None:
    r = analyse(RAMP)
    assert r["conditions"]["models"] == {"sim-tiny": 181}
    assert r["conditions"]["concurrency_at_start"]["max"] == 8
    assert {w["code"] for w in r["warnings"]} >= {"QUEUEING"}
    assert r["capacity"]["max_concurrency_at_slo"] is not None
    by = {b["concurrency"]: b for b in r["by_concurrency"]}
    assert by[6]["ttft_p95"] > 3 * by[1]["ttft_p95"]  # queueing past 4 sequence slots
    assert "QUEUEING" in render_text(r)
    eng = ReplayEngine(RAMP)
    eng.run_to_end()
    snap = eng.snapshot(None)
    assert snap["latency"]["ttft"] == r["latency"]["ttft"]
    assert snap["system"]["in_flight_max"] == 8
    assert export_parquet(RAMP, tmp_path)["requests"] == 181
    assert pq.read_table(tmp_path / "requests.parquet").num_rows == 181
