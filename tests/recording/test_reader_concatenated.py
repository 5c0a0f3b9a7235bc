"""Two recordings concatenated (``cat a.jsonl b.jsonl``) are read as one, with the second
header counted as a bad line and named — and, when the two were made with different SLOs,
the note says every request is judged against the first's (QA: it said nothing, and B's
requests were silently judged against A's objectives)."""

from __future__ import annotations

from pathlib import Path

from rec_helpers import session, write_recording

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader

SLO = {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}


def _cat(tmp_path: Path, slo_b: dict[str, float]) -> tuple[list[str], int, int]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_recording(a, session(30, duration_s=5), header={"slo": SLO})
    write_recording(b, session(20, duration_s=5, seed=2), header={"slo": slo_b})
    both = tmp_path / "both.jsonl"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    with RecordingReader(both) as r:
        n = sum(isinstance(e, RequestRecord) for e in r)
        return list(r.problems), n, r.bad_lines


def test_a_second_header_with_other_slos_says_whose_slos_judge(tmp_path: Path) -> None:
    problems, n, bad = _cat(tmp_path, {**SLO, "ttft_s": 0.2})
    assert n == 50 and bad >= 1
    said = [p for p in problems if "a second header" in p]
    assert said and "its SLOs differ from the first header's" in said[0], problems


def test_a_second_header_with_the_same_slos_says_only_that(tmp_path: Path) -> None:
    problems, n, _ = _cat(tmp_path, dict(SLO))
    said = [p for p in problems if "a second header" in p]
    assert n == 50 and said and "SLOs differ" not in said[0], problems
