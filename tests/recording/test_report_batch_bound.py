"""Report and Parquet export file their records in batches bounded by chunks as well as by
records (QA soak: 3,000 answers of 2,000 chunks peaked at 2.3 GB in `report` and 588 MB in
`export --parquet`; now ~300 and ~145 MB). The batching must not change any figure."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rec_helpers import request, soon, write_recording

import llmtop.recording.parquet as parquet
import llmtop.recording.report.analyse as analyse
from llmtop.cli import main


def _recording(tmp_path: Path) -> Path:
    t0 = soon()
    recs = [request(i, t0 + i * 0.05, n_chunks=50, gap=0.01) for i in range(40)]
    path = tmp_path / "long.jsonl"
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s))
    return path


def test_report_batches_by_chunks_and_gives_the_same_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _recording(tmp_path)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    whole = json.loads(capsys.readouterr().out)
    flushes = []
    real = analyse._Collector.flush

    def counted(self: analyse._Collector) -> None:
        flushes.append(len(self._pending))
        real(self)

    monkeypatch.setattr(analyse, "_BATCH_CHUNKS", 120)  # 3 records of 50 chunks
    monkeypatch.setattr(analyse._Collector, "flush", counted)
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    batched = json.loads(capsys.readouterr().out)
    assert max(flushes) <= 3 and sum(flushes) == 40
    whole.pop("generated_at", None)
    batched.pop("generated_at", None)
    assert batched == whole


def test_parquet_row_groups_close_by_chunks(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = _recording(tmp_path)
    assert main(["export", str(path), "--parquet", str(tmp_path / "a"), "-q"]) == 0
    monkeypatch.setattr(parquet, "BATCH_CELLS", 120)
    assert main(["export", str(path), "--parquet", str(tmp_path / "b"), "-q"]) == 0
    a = pq.ParquetFile(tmp_path / "a" / "requests.parquet")
    b = pq.ParquetFile(tmp_path / "b" / "requests.parquet")
    assert a.metadata.num_row_groups == 1 and b.metadata.num_row_groups >= 13
    assert a.read().equals(b.read())
