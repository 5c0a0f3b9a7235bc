"""benchmarks/gpu_check.py runs here: "no GPU: <reason>" on this machine, and a dry run
against the fake NVML exercises its table and verdicts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=90,
        check=False,
    )


def test_real_nvml_here_says_no_gpu_or_runs() -> None:
    """On a machine without NVIDIA driver: one line "no GPU: <reason>", exit 0, no
    traceback. (On a GPU machine: a short real check with a verdict.)"""
    p = run("--phase-s", "0.3", "--idle-s", "0.2")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    if p.stdout.startswith("no GPU: "):
        assert p.stdout.count("\n") == 1
        assert "NVML" in p.stdout or "NVIDIA" in p.stdout
    else:
        assert "verdict:" in p.stdout


def test_dry_run_on_fake_nvml() -> None:
    p = run("--fake", "--phase-s", "0.6", "--idle-s", "0.3", "--hz", "20", "--every", "3")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "GPU 0: NVIDIA H200 (fake)" in out and "GPM yes" in out
    assert "dramBW%" in out and "per phase (medians):" in out
    verdict = out.split("verdict:")[1]
    assert "UNEXPECTED" not in verdict
    assert verdict.count("OK") == 5
    assert "busy time, not bandwidth" in verdict
