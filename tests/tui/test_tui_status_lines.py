"""An empty engine or GPU panel says why, from the snapshot's ``engine.status`` and
``gpu_status`` (it said only "n/a (no engine metrics)" / "n/a (no GPU readings)" whatever
the cause: a 404 on the engine's /metrics, no NVIDIA driver, a lost GPU)."""

from __future__ import annotations

from typing import Any

from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.engine import EnginePanel
from llmtop.tui.widgets.gpu import GpuPanel

NO_ENGINE: dict[str, Any] = {"kind": None, "running": None, "waiting": None,
                             "kv_cache_usage": None, "t": None, "age_s": None}


def _engine(snap: dict[str, Any], width: int = 160) -> str:
    panel = EnginePanel()
    panel.view = SnapView(snap)
    return panel.build(width).plain  # type: ignore[union-attr]


def _gpu(snap: dict[str, Any], width: int) -> str:
    panel = GpuPanel()
    panel.view = SnapView(snap)
    out = panel.build(width)
    return out.plain if hasattr(out, "plain") else " / ".join(
        r.plain for r in out.renderables)  # type: ignore[attr-defined]


def test_the_engine_panel_says_why_it_has_no_reading() -> None:
    url = "http://127.0.0.1:8000/metrics"
    text = _engine({"time": 1.0, "engine": {**NO_ENGINE, "status": f"no /metrics at {url} "
                                                                    "(HTTP 404)"}})
    assert text == f"engine n/a (no /metrics at {url} (HTTP 404))"
    assert _engine({"time": 1.0, "engine": dict(NO_ENGINE)}) == "engine n/a (no engine metrics)"


def test_a_stale_engine_reading_says_why_the_scrapes_fail() -> None:
    eng = {"kind": "vllm", "running": 3, "waiting": 0, "kv_cache_usage": 0.5, "t": 1.0,
           "age_s": 45.0, "status": "no /metrics at http://h:8000/metrics (timed out)"}
    text = _engine({"time": 46.0, "engine": eng})
    assert "stale 45" in text and "(timed out)" in text, text
    fresh = dict(eng, age_s=0.5, status="vllm engine at http://h:8000/metrics")
    assert "engine at" not in _engine({"time": 46.0, "engine": fresh})


def test_the_gpu_panel_says_why_there_are_no_readings_and_names_a_lost_gpu() -> None:
    why = ("no NVIDIA GPU found (NVML: no NVML library (libnvidia-ml.so.1 not found: is the "
           "NVIDIA driver installed?)); GPU panel disabled")
    for width in (160, 60):
        text = _gpu({"time": 1.0, "gpus": [], "gpu_status": why}, width)
        assert "no NVIDIA GPU found" in text, text
        assert "no GPU readings" in _gpu({"time": 1.0, "gpus": []}, width)
    gpu = {"index": 0, "name": "H200", "host": "h", "mem_used_bytes": 1, "mem_total_bytes": 2}
    lost = _gpu({"time": 1.0, "host": "h", "gpus": [gpu], "gpu_status": "2 GPUs; GPU 1 lost"},
                160)
    assert "2 GPUs; GPU 1 lost" in lost, lost
    fine = _gpu({"time": 1.0, "host": "h", "gpus": [gpu], "gpu_status": "1 GPU"}, 160)
    assert fine.startswith("GPU  bw = DRAM bandwidth"), fine  # all is well: nothing added
