"""A request line whose times contradict each other (its first token after its end,
chunks out of time order, a chunk after its end) was read as written: in a 30-request
recording, a damaged TTFT of 5 s in a request that took 318 ms showed among the slowest,
and an offset of 30 s a 29.6 s ITL max. No writer of ours makes such a line; each is now
skipped as a bad line with the reason, like any other value that cannot be right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.validate import InvalidLine, request_from

FIXTURE = Path(__file__).parent.parent / "fixtures" / "recordings" / "sim_tiny_short.jsonl"


def first_request() -> dict[str, object]:
    line = next(ln for ln in FIXTURE.read_text().splitlines() if '"request"' in ln)
    d: dict[str, object] = json.loads(line)
    return d


def test_the_fixture_line_is_consistent() -> None:
    rec, _ = request_from(first_request())
    assert rec.ttft_s is not None and rec.ttft_s <= rec.e2e_s
    assert rec.chunk_offsets_s[-1] <= rec.e2e_s


@pytest.mark.parametrize("slow", [False, True], ids=["fast-path", "defaulted-path"])
@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d.update(ttft_s=5.0), "ttft_s (5 s) is after the request's end"),
    (lambda d: d["chunk_offsets_s"].reverse(), "chunk_offsets_s is not in time order"),
    (lambda d: d["chunk_offsets_s"].__setitem__(-1, 30.0),
     "chunk_offsets_s holds a time (30 s) after the request's end"),
], ids=["ttft-after-end", "unsorted", "chunk-after-end"])
def test_a_line_that_contradicts_itself_is_refused(change, said: str, slow: bool) -> None:  # type: ignore[no-untyped-def]
    d = first_request()
    change(d)
    if slow:
        del d["concurrency_at_start"]  # (a defaulted field: the line takes the slow path)
    with pytest.raises(InvalidLine, match=said.replace("(", r"\(").replace(")", r"\)")):
        request_from(d)


def test_equal_times_are_not_a_contradiction() -> None:
    d = first_request()
    offs = d["chunk_offsets_s"]
    assert isinstance(offs, list)
    d.update(ttft_s=d["e2e_s"], chunk_offsets_s=[d["e2e_s"]] * len(offs))
    rec, _ = request_from(d)
    assert rec.ttft_s == rec.e2e_s


def test_the_reader_skips_and_names_them(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if '"request"' in ln)
    d = json.loads(lines[i])
    d["ttft_s"] = 5.0
    lines[i] = json.dumps(d)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with RecordingReader(path) as r:
        got = [e for e in r if isinstance(e, RequestRecord)]
        assert r.bad_lines == 1
        assert any("is after the request's end" in p for p in r.problems)
    assert len(got) == sum('"request"' in ln for ln in lines) - 1
    assert all(e.ttft_s is None or e.ttft_s <= e.e2e_s for e in got)
