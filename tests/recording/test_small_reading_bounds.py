"""A GPU or engine reading whose figure no GPU or engine can have (1e308 W, 1e308 requests
running): read as it was, `llmtop report` printed its 309 digits ("running max
100,000,000,000,000,001,097,…", a 1,477-character GPU line) and a replay showed it. Such
a line is damage, as a negative duration is: skipped and counted as a bad line, its field
and value told, in report, replay and export alike (all read through the reader)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import EngineReading, Event, GpuReading
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplayEngine

HUGE = 1e308
GPU_FIGURES = ("util_gpu", "mem_busy", "dram_bw_util", "sm_activity", "power_w",
               "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
               "pcie_rx_bytes_s", "pcie_tx_bytes_s")
ENGINE_FIGURES = ("running", "waiting", "kv_cache_usage", "preemptions")
LONG_DIGITS = re.compile(r"\d[\d,]{29,}")
"""A run of 30 digits (and separators): no figure llmtop prints is that long."""


def _gpu(t: float, index: int, **kw: float) -> GpuReading:
    base: dict[str, float] = {"util_gpu": 100.0, "mem_busy": 60.0, "dram_bw_util": 80.0,
                              "sm_activity": 90.0, "power_w": 700.0, "power_limit_w": 700.0,
                              "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0,
                              "temperature_c": 85.0, "pcie_rx_bytes_s": 5e10,
                              "pcie_tx_bytes_s": 5e10}
    return GpuReading(t=t, index=index, name="H100", mem_used_bytes=70 << 30,
                      mem_total_bytes=80 << 30, **{**base, **kw})


def _engine(t: float, **kw: float) -> EngineReading:
    base = {"running": 12.0, "waiting": 3.0, "kv_cache_usage": 0.9, "preemptions": 4.0}
    return EngineReading(t=t, kind="vllm", **{**base, **kw})


def _recording(path: Path, damaged: list[Event]) -> int:
    """A real session, its sane readings (GPU 1, realistic highs) and ``damaged`` near its
    end; returns how many damaged lines were written."""
    evs = session(40, duration_s=5)
    t0 = min(e.t for e in evs if isinstance(e, GpuReading))
    evs += [_gpu(t0 + k * 0.1, 1) for k in range(3)] + [_engine(t0 + k * 0.1) for k in range(3)]
    evs += damaged
    evs.sort(key=lambda e: getattr(e, "t", None) or getattr(e, "t_start", 0.0))
    write_recording(path, evs)
    return len(damaged)


def _t(path: Path) -> float:
    with RecordingReader(path) as r:
        return max(e.t for e in r if isinstance(e, GpuReading))


@pytest.mark.parametrize("field", GPU_FIGURES + ENGINE_FIGURES)
def test_each_figure_past_its_bound_is_a_bad_line_that_names_it(tmp_path: Path,
                                                                 field: str) -> None:
    probe = tmp_path / "probe.jsonl"
    _recording(probe, [])
    t = _t(probe) + 0.5
    bad: Event = (_gpu(t, 1, **{field: HUGE}) if field in GPU_FIGURES
                  else _engine(t, **{field: HUGE}))
    path = tmp_path / "r.jsonl"
    n = _recording(path, [bad])
    with RecordingReader(path) as r:
        read = list(r)
        s = r.summary()
    assert s["bad_lines"] == n
    assert any(f"{field} is 1e+308, above" in p for p in s["problems"]), s["problems"]
    # the sane readings (a full H100 at 700 W, 85 °C) are all read
    assert sum(isinstance(e, GpuReading) and e.index == 1 for e in read) == 3
    assert sum(isinstance(e, EngineReading) for e in read) >= 3


def test_report_replay_and_export_leave_the_damaged_readings_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe = tmp_path / "probe.jsonl"
    _recording(probe, [])
    t = _t(probe) + 0.5
    everything = dict.fromkeys(GPU_FIGURES, HUGE)
    damaged: list[Event] = [_gpu(t, 2, **everything), _gpu(t + 0.1, 1, power_w=HUGE),
                            _engine(t, **dict.fromkeys(ENGINE_FIGURES, HUGE))]
    path = tmp_path / "r.jsonl"
    _recording(path, damaged)

    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert not LONG_DIGITS.search(out), [ln[:120] for ln in out.splitlines()
                                         if LONG_DIGITS.search(ln)]
    assert "3 bad lines skipped" in out
    assert "gpu: util_gpu is 1e+308" in out and "engine: running is 1e+308" in out
    assert "GPU 2" not in out  # its only reading was damaged
    assert "power 700 W" in out and "running max 12" in out

    eng = ReplayEngine(path)
    eng.run_to_end()
    snap = eng.snapshot(None)
    eng.close()
    assert {g["index"] for g in snap["gpus"]} == {0, 1}
    assert all(g["power_w"] is None or g["power_w"] <= 1e6 for g in snap["gpus"])
    assert snap["engine"]["running"] is not None and snap["engine"]["running"] < 1e12

    dest = tmp_path / "pq"
    capsys.readouterr()
    assert main(["export", str(path), "--parquet", str(dest)]) == 0
    err = capsys.readouterr().err
    assert "3 bad lines skipped" in err and "power_w is 1e+308" in err
    gpu = pq.read_table(dest / "gpu.parquet").to_pylist()
    assert 2 not in {row["index"] for row in gpu}
    assert max(row["power_w"] or 0.0 for row in gpu) <= 1e6
    engine = pq.read_table(dest / "engine.parquet").to_pylist()
    assert max(row["running"] or 0.0 for row in engine) < 1e12
