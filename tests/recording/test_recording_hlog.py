"""HdrHistogram interval log export, read back with hdrh's own HistogramLogReader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.hlog import TAGS, export_hlog
from llmtop.recording.replay import config_for


@pytest.fixture
def recording(tmp_path: Path) -> tuple[Path, list[Event]]:
    events = session(300, duration_s=45)
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, events)
    return path, events


def test_hlog_reads_back_with_hdrh(tmp_path: Path, recording: tuple[Path, list[Event]]) -> None:
    path, events = recording
    out = tmp_path / "s.hlog"
    counts = export_hlog(path, out, interval_s=5)
    assert all(counts[t] >= 8 for t in TAGS), counts  # 45 s in 5 s intervals
    reader = HistogramLogReader(str(out), HdrHistogram(1, 3_600_000_000, 3))
    totals = dict.fromkeys(TAGS, 0)
    merged = {t: HdrHistogram(1, 3_600_000_000, 3) for t in TAGS}
    starts: list[float] = []
    try:
        while (h := reader.get_next_interval_histogram()) is not None:
            tag = h.get_tag()
            totals[tag] += h.get_total_count()
            merged[tag].add(h)
            starts.append(h.get_start_time_stamp())
    finally:
        reader.input_file.close()
    assert len(set(starts)) >= 8
    # exactly the samples the live aggregator counts (same ingest code)
    agg = Aggregator(config_for({"slo": {}}))
    agg.on_events(events)
    snap = agg.snapshot(None)
    assert totals == {t: snap["latency"][t]["count"] for t in TAGS}
    oks = sum(1 for e in events if isinstance(e, RequestRecord) and e.outcome == "ok")
    assert totals["e2e"] == oks > 250  # E2E from ok requests only
    # and the merged intervals give the aggregator's percentiles (same HDR layout)
    for tag in TAGS:
        p95 = merged[tag].get_value_at_percentile(95) / 1e6
        assert p95 == pytest.approx(snap["latency"][tag]["p95"], abs=1e-6), tag
    ttft = [e.ttft_s for e in events if isinstance(e, RequestRecord) and e.ttft_s is not None]
    assert merged["ttft"].get_value_at_percentile(95) / 1e6 == pytest.approx(
        float(np.percentile(ttft, 95)), rel=0.02)


def test_hlog_cli(tmp_path: Path, recording: tuple[Path, list[Event]],
                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.hlog"
    assert main(["export", str(recording[0]), "--hlog", str(out), "--interval", "15"]) == 0
    assert "intervals per tag: ttft" in capsys.readouterr().out
    # 45 s of requests starting ~10 s after the recording did: 4 intervals of 15 s
    assert 3 <= out.read_text().count("Tag=ttft,") <= 5
    assert main(["export", str(recording[0]), "--hlog", "/proc/nope/x.hlog"]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_interval_max_is_in_milliseconds_and_the_log_says_so(
        tmp_path: Path, recording: tuple[Path, list[Event]]) -> None:
    """HdrHistogram's log writers divide the interval maximum by a maxValueUnitRatio (10^6
    by default, for nanosecond values) so the column reads in milliseconds; ours divides µs
    by 1000 — and the first comment line, which says the values are µs, says so too."""
    out = tmp_path / "s.hlog"
    export_hlog(recording[0], out, interval_s=5)
    lines = out.read_text().splitlines()
    assert "Interval_Max is in milliseconds" in lines[0]
    assert "values are latencies in microseconds" in lines[0]
    rows = [ln for ln in lines if ln.startswith("Tag=")]
    assert len(rows) >= 40
    for row in rows:
        tag, _start, _length, max_ms, blob = row.split(",")
        h = HdrHistogram.decode(blob)
        assert float(max_ms) == pytest.approx(h.get_max_value() / 1000, abs=0.0005), tag
    e2e_max_ms = max(float(r.split(",")[3]) for r in rows if r.startswith("Tag=e2e,"))
    e2e = max(e.e2e_s for e in recording[1] if isinstance(e, RequestRecord) and e.outcome == "ok")
    assert e2e_max_ms == pytest.approx(e2e * 1000, rel=0.002)  # seconds → ms
