"""benchmarks/proxy_overhead.py when a target measures nothing: before, a variant that did
not start ended the run in a traceback, and one that answered every request with an error
gave a row of "0 requests" and "n/a" and exit 0 — a comparison that compared nothing. Now
its row reads FAILED, stderr says which target and why, and the run exits 3 (a target that
works keeps its figures). Tiny runs: one level of one stream, 0.3 s phases, no nginx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from proxy_overhead import EXIT_FAILED, run_load

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "proxy_overhead.py"


def _bench(*variant: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), "--duration", "0.3", "--levels", "1", "--modes", "paced",
         "--no-nginx", "--max-tokens", "8", *variant],
        capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)


def _row(stdout: str, target: str) -> str:
    rows = [ln for ln in stdout.splitlines() if ln.split()[:2] == ["1", target]]
    assert len(rows) == 1, stdout
    return rows[0]


def test_a_variant_that_cannot_start_fails_the_run(tmp_path: Path) -> None:
    broken = tmp_path / "llmtop"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise SystemExit("this llmtop is broken")\n')
    p = _bench("--variant", f"PYTHONPATH={tmp_path}")
    assert p.returncode == EXIT_FAILED == 3, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "variant FAILED" in ln]
    assert said and "exited with code 1" in said[0] and "this llmtop is broken" in said[0], \
        p.stderr
    assert "FAILED" in _row(p.stdout, "variant")
    assert "FAILED" not in _row(p.stdout, "llmtop")  # the others were measured


def test_a_variant_that_answers_only_errors_fails_the_run() -> None:
    p = _bench("--variant", "LLMTOP_MAX_BODY_BYTES=1")  # every request: 413
    assert p.returncode == EXIT_FAILED, p.stdout + p.stderr
    said = [ln for ln in p.stderr.splitlines() if "variant FAILED" in ln]
    assert said and "HTTP/1.1 413" in said[0], p.stderr
    assert "FAILED" in _row(p.stdout, "variant")
    assert "[paced] FAILED 1 streams: variant measured nothing" in p.stdout


def test_a_working_variant_keeps_its_figures_and_exit_0() -> None:
    p = _bench("--variant", "LLMTOP_SLO_TTFT_S=5")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAILED" not in p.stdout + p.stderr
    for target in ("direct", "llmtop", "variant"):
        assert int(_row(p.stdout, target).split()[2]) > 0, p.stdout  # its requests


async def test_a_target_not_listening_is_a_phase_that_says_so() -> None:
    """(Before: ConnectionRefusedError out of the load generator, and the run's end.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        phase = await run_load(f"http://127.0.0.1:{port}", 3, 0.2, 8, False)
    assert phase.results == [] and phase.errors == 3
    assert phase.first_error is not None and "refused" in phase.first_error, phase.first_error
