"""A tiny run of benchmarks/worker_scaling.py over real sockets: two ``llmtop sim
--reuse-port`` processes on one port, two load generator processes, direct vs llmtop with 1
and 2 workers. Figures are not judged (that is the benchmark's job, on a machine with cores
to spare); every cell must have carried traffic, the table must be well formed, and a run
that is not pinned must not give a verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import worker_scaling as ws


def test_core_plan_gives_each_role_its_own_cores() -> None:
    plan = ws.plan_cores(4, 3, False, available=range(16))
    assert plan.pinned and plan.proxy == [0, 1]
    roles = plan.proxy + plan.sims + plan.loaders
    assert len(plan.sims) == 4 and len(plan.loaders) == 3 and len(set(roles)) == 9
    short = ws.plan_cores(4, 3, False, available=range(8))
    assert not short.pinned and "8 cores, 9 needed" in short.why
    assert not ws.plan_cores(1, 1, True, available=range(16)).pinned


def test_pinned_command_runs_on_the_given_core() -> None:
    cmd = ws.pinned([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                    [0])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[0]"


def test_worker_scaling_smoke() -> None:
    args = ws.parse_args(["--streams", "4", "--duration", "1", "--warmup", "0.5", "--sims", "2",
                          "--loaders", "2", "--rounds", "1", "--no-nginx", "--no-pin",
                          "--max-tokens", "16"])
    report = ws.run(args)
    by = {c.config: c for c in report.cells}
    assert set(by) == {"direct", "llmtop-1w", "llmtop-2w"}
    for name, cell in by.items():
        assert cell.chunks_per_s > 0 and cell.requests > 0 and cell.errors == 0, name
        if name != "direct":
            assert cell.cpu_s is not None and cell.cpu_s > 0
            assert cell.cpu_us_per_chunk is not None and cell.cpu_us_per_chunk > 0
    assert by["llmtop-2w"].cores == 2 and by["llmtop-1w"].cores == 1
    text = ws.render(report)
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + 3 and len({ln.count("|") for ln in table}) == 1
    verdict = ws.verdict(report)
    assert verdict[0].startswith("[firehose] n/a (not a fair figure)")
    assert any("unpinned: --no-pin" in ln for ln in verdict)


def test_cells_that_measure_nothing_fail_the_run(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """llmtop answering every request 413 (a 1-byte body limit; the simulators do not read
    it): before, rows of 0 chunks/s, a verdict of n/a and exit 0. Now the cells read
    FAILED, stderr says why, and the run exits 3; direct keeps its figure."""
    monkeypatch.setenv("LLMTOP_MAX_BODY_BYTES", "1")
    rc = ws.main(["--streams", "2", "--duration", "0.5", "--warmup", "0.2", "--sims", "1",
                  "--loaders", "1", "--rounds", "1", "--no-nginx", "--no-pin",
                  "--max-tokens", "8"])
    out, err = capsys.readouterr()
    assert rc == 3, out + err
    for config in ("llmtop-1w", "llmtop-2w"):
        said = [ln for ln in err.splitlines() if f"{config} FAILED" in ln]
        assert said and "HTTP/1.1 413" in said[0], err
        assert f"| {config} | FAILED" in out, out
    direct = next(ln for ln in out.splitlines() if ln.startswith("| direct |"))
    assert int(direct.split("|")[6]) > 0, direct  # its requests
    assert "[firehose] FAILED 2 workers vs 1" in out
