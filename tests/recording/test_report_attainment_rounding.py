"""An SLO attainment below its target never reads as the target (QA hunt: report vs
recording).

Shares are shown to 0.1%: 39 of 40 requests (97.5%) against a target of 97.51% read
"attainment 97.5% (BELOW the target)" beside "target 97.5%", and the capacity line "even
concurrency 1 misses the SLOs (met by 97.5% ...; target 97.5%)". A share below the target
that rounds to it now reads "<97.5%"; one below 100% never reads "100.0%". Recordings are
written by the real recorder and read back by ``llmtop report``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event
from llmtop.recording.report.fmt import attainment


def test_attainment_below_the_target_never_rounds_to_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = soon()
    # 40 at concurrency 1, one of them with a TTFT over the 0.5 s objective
    recs = [request(i, t0 + i, ttft=0.9 if i == 7 else 0.1) for i in range(40)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    path = tmp_path / "r.jsonl"
    write_recording(path, events)
    for fmt in ("text", "html"):
        capsys.readouterr()
        assert main(["report", str(path), "--slo-target", "0.9751", "-q",
                     "--format", fmt, "-o", str(tmp_path / f"out.{fmt}")]) == 0
        out = (tmp_path / f"out.{fmt}").read_text()
        assert "<97.5%" in out or "&lt;97.5%" in out
        assert "met by 97.5%" not in out
    text = (tmp_path / "out.text").read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("attainment"))
    assert "<97.5%" in line and "BELOW" in line


@pytest.mark.parametrize(("share", "target", "shown"), [
    (0.975, 0.9751, "<97.5%"),
    (0.975, 0.975, "97.5%"),
    (0.9749, 0.95, "97.5%"),
    (0.94996, 0.95, "<95.0%"),
    (0.9996, 0.95, "<100.0%"),
    (1.0, 0.95, "100.0%"),
    (0.5, None, "50.0%"),
    (None, 0.95, "n/a"),
])
def test_attainment_text(share: float | None, target: float | None, shown: str) -> None:
    assert attainment(share, target) == shown
