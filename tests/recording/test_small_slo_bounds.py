"""A recording header whose SLO no proxy could have run with (ttft_s 1e308: the proxy's
config refuses a time objective over a day) was taken as it was: `llmtop report` printed
"TTFT ≤ 1000000000000000010979…" — 309 digits, a 911-character line — twice, and judged
every request against it. Like a NaN or negative objective, it is dropped, and said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplayEngine

LONG_DIGITS = re.compile(r"\d{30,}")


@pytest.mark.parametrize("key", ["ttft_s", "itl_p95_s", "tpot_s", "e2e_s"])
def test_a_time_objective_past_a_day_is_dropped_and_said(
        tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    slo = {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95, key: 1e308}
    write_recording(path, session(40, duration_s=5), header={"upstream": "u", "slo": slo})
    with RecordingReader(path) as r:
        assert key not in r.header["slo"]
        assert r.header["slo"]["target"] == 0.95
        assert r.problems == [f"line 1: header slo {key} (1e+308 s) is more than a day, "
                              "not an objective; ignored"]
        assert len(list(r)) > 40

    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert not LONG_DIGITS.search(out), [ln[:100] for ln in out.splitlines()
                                         if LONG_DIGITS.search(ln)]
    assert f"header slo {key} (1e+308 s) is more than a day" in out

    eng = ReplayEngine(path)
    assert getattr(eng.cfg.slo, key) != 1e308
    eng.close()

    dest = tmp_path / "pq"
    assert main(["export", str(path), "--parquet", str(dest)]) == 0
    assert f"slo {key} (1e+308 s) is more than a day" in capsys.readouterr().err


def test_a_day_is_still_an_objective(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, session(40, duration_s=5),
                    header={"upstream": "u", "slo": {"e2e_s": 86_400.0, "target": 0.9}})
    with RecordingReader(path) as r:
        assert r.header["slo"] == {"e2e_s": 86_400.0, "target": 0.9}
        assert r.problems == []
    out = tmp_path / "r.json"
    assert main(["report", str(path), "-q", "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["conditions"]["slo"]["e2e_s"] == 86_400.0
