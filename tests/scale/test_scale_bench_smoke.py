"""A tiny run of benchmarks/scale_overhead.py's core: 4 streams, about a second per cell,
direct vs llmtop with 1 and 2 workers and the admin API polled at 10 Hz, over real sockets
against ``llmtop sim``. Figures are not judged (that is the benchmark's job); the tables
must be well formed and every cell must have carried traffic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import scale_overhead as so


async def test_scale_bench_produces_well_formed_tables() -> None:
    args = so.parse_args(["--streams", "4", "--duration", "1", "--modes", "paced",
                          "--no-nginx", "--max-tokens", "16"])
    report = await so.run_scale(args)
    cells = report.cells["paced"][4]
    assert set(cells) == {"direct", "llmtop-1w", "llmtop-2w", "llmtop-1w+poll"}
    for name, cell in cells.items():
        assert cell.res.requests > 0 and cell.res.errors == 0, name
        assert cell.res.chunks >= 16 * cell.res.requests, name
        if name != "direct":
            assert cell.res.cpu_us_per_chunk is not None and cell.res.cpu_us_per_chunk > 0
    assert cells["llmtop-2w"].capacity is not None
    polled = cells["llmtop-1w+poll"]
    # the poller ticks at 10 Hz for about the cell's second (11 ticks here under four CPU
    # hogs): how many is a timing figure, not this test's; it needs ticks enough for some
    # to share a snapshot. The TUI's source asks again only once its snapshot is 0.5 s
    # old (max_age), so ticks outnumber GETs
    assert polled.ticks is not None and polled.ticks >= 3
    assert polled.polls is not None and 1 <= polled.polls < polled.ticks

    text = so.render(report)
    figures = so.figures_table(report).splitlines()
    width = figures[0].count("|")
    assert all(ln.count("|") == width for ln in figures)
    assert len(figures) == 2 + 4
    targets = so.targets_table(report).splitlines()
    assert all(ln.count("|") == 8 for ln in targets)
    body = targets[2:]
    assert body and all(ln.rstrip(" |").endswith(("PASS", "MISS", "n/a")) for ln in body)
    assert any("polled 10 Hz" in ln for ln in body)
    assert "nginx not measured (--no-nginx)" in text


async def test_cells_that_measure_nothing_fail_the_run(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """llmtop answering every request 413 (a 1-byte body limit; the simulator does not read
    it): before, rows of 0 requests and exit 0. Now those cells read FAILED with the status
    line the load generator saw, stderr says so, no target is judged on them, exit 3."""
    monkeypatch.setenv("LLMTOP_MAX_BODY_BYTES", "1")
    args = so.parse_args(["--streams", "2", "--duration", "0.3", "--modes", "paced",
                          "--no-nginx", "--max-tokens", "8", "--workers", "1", "--no-poll"])
    assert await so.amain(args) == 3
    out, err = capsys.readouterr()
    said = [ln for ln in err.splitlines() if "llmtop-1w FAILED" in ln]
    assert said and "HTTP/1.1 413" in said[0], err
    rows = [ln for ln in out.splitlines() if ln.startswith("| paced | 2 |")]
    assert len(rows) == 2 and "FAILED" in rows[1] and "FAILED" not in rows[0], rows
    head = next(ln for ln in out.splitlines() if ln.startswith("| mode | streams | via"))
    assert rows[1].count("|") == head.count("|")  # the table keeps its columns
    assert "| llmtop-1w |" not in out  # no target judged on it
