"""``export --parquet`` writes its four tables all or none: a failure while finishing one
table (a full disk, the file size limit) left the tables finished before it renamed into
place — a set of tables from two exports, or one table alone."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from disk_support import llmtop, workdir
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import GpuReading, RequestRecord

TABLES = ("requests", "gpu", "engine", "warnings")


def _rows(out: Path) -> dict[str, int]:
    return {t: pq.read_table(out / f"{t}.parquet").num_rows for t in TABLES
            if (out / f"{t}.parquet").is_file()}


def test_a_table_name_taken_by_a_directory_is_refused_before_anything_is_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It failed at the end, after reading the whole recording, with requests.parquet and
    gpu.parquet already replaced by the new export's, and named the temporary file
    ('out/.engine.parquet.part: Is a directory')."""
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    write_recording(old, session(20, duration_s=5))
    write_recording(new, session(60, duration_s=9))
    out = tmp_path / "out"
    assert main(["export", str(old), "--parquet", str(out), "-q"]) == 0
    before = _rows(out)
    (out / "engine.parquet").unlink()
    (out / "engine.parquet").mkdir()
    assert main(["export", str(new), "--parquet", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"llmtop export: error: {out / 'engine.parquet'}: is a directory"
    assert _rows(out) == {t: n for t, n in before.items() if t != "engine"}
    assert sorted(p.name for p in out.iterdir()) == [f"{t}.parquet" for t in sorted(TABLES)]


def test_a_table_that_cannot_be_finished_leaves_none_replaced() -> None:
    """Under a file size limit that the requests table fits and the gpu table does not
    (a recording of 3 requests and an hour of GPU readings): requests.parquet was renamed
    into place before gpu.parquet failed."""
    with workdir() as work:
        events = sorted(
            [e for e in session(3, duration_s=2) if isinstance(e, RequestRecord)]
            + [GpuReading(t=e.t + k, index=0, name="g", mem_used_bytes=k * 1000 + 7,
                          mem_total_bytes=10**11, util_gpu=k % 97 + 0.5, power_w=k * 1.5,
                          simulated=True)
               for e in session(1, duration_s=1)[:1] for k in range(3600)],
            key=lambda e: e.t_start + e.e2e_s if isinstance(e, RequestRecord) else e.t)
        rec = work / "r.jsonl"
        write_recording(rec, events)
        full = work / "full"
        assert main(["export", str(rec), "--parquet", str(full), "-q"]) == 0
        sizes = {t: (full / f"{t}.parquet").stat().st_size for t in TABLES}
        limit = (sizes["requests"] + sizes["gpu"]) // 2
        assert sizes["requests"] < limit < sizes["gpu"], sizes
        out = work / "out"
        p = llmtop("export", str(rec), "--parquet", str(out), "-q", work=work, fsize=limit)
        assert p.returncode == 1, p.stderr
        assert "gpu.parquet" in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
