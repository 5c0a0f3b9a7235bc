"""Parquet export read back with pyarrow, and the `llmtop export` command's exit codes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent
from llmtop.recording import parquet
from llmtop.recording.parquet import export_parquet


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def recording(tmp_path: Path) -> tuple[Path, list]:  # type: ignore[type-arg]
    events = session(300, duration_s=45, gpus=2)
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, events)
    return path, events


def test_parquet_tables_have_the_right_rows(tmp_path: Path, recording: tuple) -> None:  # type: ignore[type-arg]
    path, events = recording
    counts = export_parquet(path, tmp_path / "pq", batch_rows=64)  # several row groups
    want = {
        "requests": sum(isinstance(e, RequestRecord) for e in events),
        "gpu": sum(isinstance(e, GpuReading) for e in events),
        "engine": sum(isinstance(e, EngineReading) for e in events),
        "warnings": sum(isinstance(e, WarningEvent) for e in events),
    }
    assert counts == want
    for name, n in want.items():
        t = pq.read_table(tmp_path / "pq" / f"{name}.parquet")
        assert t.num_rows == n, name
    req = pq.read_table(tmp_path / "pq" / "requests.parquet").to_pylist()
    recs = [e for e in events if isinstance(e, RequestRecord)]
    assert [r["id"] for r in req] == [r.id for r in recs]
    assert req[5]["chunk_offsets_s"] == list(recs[5].chunk_offsets_s)
    assert req[5]["chunk_tokens"] == list(recs[5].chunk_tokens)
    assert req[5]["tpot_s"] == pytest.approx(recs[5].tpot_s())
    assert req[5]["time"].timestamp() == pytest.approx(recs[5].t_start)
    errors = sum(r.outcome != "ok" for r in recs)
    assert sum(r["outcome"] != "ok" for r in req) == errors > 0
    eng = pq.read_table(tmp_path / "pq" / "engine.parquet").to_pylist()
    assert dict(eng[3]["raw"]) == {"vllm:num_requests_running": 3.0}
    assert eng[0]["ttft_buckets"] == [{"le": 0.1, "count": 1.0}, {"le": 1.0, "count": 2.0},
                                      {"le": float("inf"), "count": 3.0}]
    assert not list((tmp_path / "pq").glob(".*.part"))


def test_parquet_of_a_recording_without_readings_still_has_all_tables(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, [e for e in session(10, duration_s=2) if isinstance(e, RequestRecord)])
    assert export_parquet(path, tmp_path / "o") == {"requests": 10, "gpu": 0, "engine": 0,
                                                    "warnings": 0}
    t = pq.read_table(tmp_path / "o" / "gpu.parquet")
    assert t.num_rows == 0 and "mem_used_bytes" in t.schema.names


def test_parquet_holds_every_count_the_reader_takes(tmp_path: Path) -> None:
    """The reader takes counts up to 2^40 (validate.MAX_COUNT); the requests table's
    concurrency_at_start and chunk_tokens were int32, and a value past 2^31 made the export
    die in pyarrow with a traceback ('too large to fit in C integer type')."""
    reqs = [e for e in session(10, duration_s=2) if isinstance(e, RequestRecord)]
    big = 2**35
    reqs[3] = dataclasses.replace(reqs[3], concurrency_at_start=big,
                                  chunk_tokens=(big,) * len(reqs[3].chunk_tokens),
                                  completion_tokens=big * len(reqs[3].chunk_tokens))
    path = tmp_path / "r.jsonl"
    write_recording(path, reqs)
    assert export_parquet(path, tmp_path / "o")["requests"] == 10
    t = pq.read_table(tmp_path / "o" / "requests.parquet").to_pylist()
    assert t[3]["concurrency_at_start"] == big
    assert t[3]["chunk_tokens"] == [big] * len(reqs[3].chunk_tokens)
    assert t[4]["chunk_tokens"] == list(reqs[4].chunk_tokens)


@pytest.mark.parametrize("at", ["requests", "warnings"])
def test_an_interrupt_while_a_table_is_opened_leaves_no_part_file(
        tmp_path: Path, recording: tuple, monkeypatch: pytest.MonkeyPatch,  # type: ignore[type-arg]
        at: str) -> None:
    """Ctrl-C or SIGTERM (``SystemExit`` in ``llmtop export``) just after a table's
    ``.part`` file was made, before the export held the table: the file went too (the
    signal mid-export test left ``.requests.parquet.part`` behind on a busy machine)."""
    path, _ = recording
    made = parquet._Table

    class Interrupted(made):  # type: ignore[misc, valid-type]
        def __init__(self, table: Path, *args: object) -> None:
            super().__init__(table, *args)
            if table.name == f"{at}.parquet":
                assert self.tmp.exists()
                raise KeyboardInterrupt

    monkeypatch.setattr(parquet, "_Table", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_parquet(path, tmp_path / "pq")
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == []


def test_export_cli(tmp_path: Path, recording: tuple) -> None:  # type: ignore[type-arg]
    path, _ = recording
    p = run_cli("export", str(path), "--parquet", str(tmp_path / "pq"))
    assert p.returncode == 0, p.stderr
    assert "requests.parquet 300 rows" in p.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["MISSING"], "no such file"),
        (["NOTREC"], "not an llmtop recording"),
        (["REC", "--parquet", "/proc/version"], "not a directory"),
        (["REC", "--hlog", "OUT", "--interval", "0"], "--interval must be a finite number above 0"),
    ],
)
def test_export_cli_mistakes_exit_2_with_one_line(
    tmp_path: Path, recording: tuple, args: list[str], message: str,  # type: ignore[type-arg]
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = recording
    notrec = tmp_path / "notes.txt"
    notrec.write_text("hello\n")
    subst = {"MISSING": str(tmp_path / "missing.jsonl"), "NOTREC": str(notrec),
             "REC": str(path), "OUT": str(tmp_path / "o.hlog")}
    argv = [subst.get(a, a) for a in args]
    if "--parquet" not in argv and "--hlog" not in argv:
        argv += ["--parquet", str(tmp_path / "pq")]
    assert main(["export", "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("llmtop export: error: ")


def test_export_cli_requires_a_target(tmp_path: Path, recording: tuple) -> None:  # type: ignore[type-arg]
    p = run_cli("export", str(recording[0]))
    assert p.returncode == 2 and "one of the arguments --parquet --hlog is required" in p.stderr
