"""benchmarks/request_cost.py and request_path.py (A/B of ``--variant`` proxies) when a
proxy measures nothing. Before: a variant that did not start ended request_cost in a
traceback and request_path in "RuntimeError: ... did not start"; one that answered every
request with an error got a figure in request_cost all the same (its CPU over
``max(1, 0)`` requests) and a "vs base" percentage. Now its line reads FAILED, stderr says
which and why, the others keep their figures, and the run exits 3. Tiny runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _broken(tmp_path: Path) -> str:
    """A PYTHONPATH whose llmtop exits at import."""
    (tmp_path / "llmtop").mkdir()
    (tmp_path / "llmtop" / "__init__.py").write_text('raise SystemExit("this llmtop is broken")\n')
    return str(tmp_path)


def _run(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True,
                          text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)


def _line(stdout: str, name: str) -> str:
    found = [ln for ln in stdout.splitlines() if ln.strip().startswith(f"{name}:")]
    assert len(found) == 1, stdout
    return found[0]


def test_request_cost_says_which_variant_measured_nothing(tmp_path: Path) -> None:
    broken = f"PYTHONPATH={_broken(tmp_path)}"
    p = _run("request_cost.py", "--rounds", "1", "--duration", "0.3", "--conns", "2",
             "--headless", "--variant", "LLMTOP_MAX_BODY_BYTES=1", "--variant", broken)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    err = p.stderr.splitlines()
    refused = [ln for ln in err if "LLMTOP_MAX_BODY_BYTES=1 FAILED" in ln]
    assert refused and "HTTP/1.1 413" in refused[0], p.stderr
    gone = [ln for ln in err if f"{broken} FAILED" in ln]
    assert gone and "exited with code 1" in gone[0] and "this llmtop is broken" in gone[0]
    assert "FAILED" in _line(p.stdout, "LLMTOP_MAX_BODY_BYTES=1")  # no µs figure
    assert "FAILED" in _line(p.stdout, broken)
    assert "median" in _line(p.stdout, "base")


def test_request_path_says_which_variant_did_not_start(tmp_path: Path) -> None:
    broken = f"PYTHONPATH={_broken(tmp_path)}"
    p = _run("request_path.py", "--rounds", "1", "--seconds", "0.1", "--kinds", "s1",
             "--variant", broken)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "this llmtop is broken" in p.stderr, p.stderr
    said = [ln for ln in p.stderr.splitlines() if f"{broken} FAILED" in ln]
    assert said and "exit code 1" in said[0], p.stderr
    row = _line(p.stdout, "s1")
    assert f"{broken}: FAILED" in row and "base:" in row and "base: FAILED" not in row, row
