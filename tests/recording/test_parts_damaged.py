"""A rotated recording with a damaged part: a part's header with an absurd number, a file
named like a part that cannot be read as one. The stem still reads the rest, and what was
left out is told as what it is."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
from rec_helpers import feed

from llmtop.recording.parts import Series, open_recording, resolve
from llmtop.recording.writer import Recorder


def rotated(stem: Path, n: int = 60) -> list[Path]:
    """A run's parts in order (the real Recorder, rotating every ~3 kB)."""
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5}},
                   flush_s=0.1, order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, n)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and not src.missing and len(src.files) >= 4, src
    return list(src.files)


def _set_header(path: Path, **kw: object) -> None:
    head, rest = path.read_text().split("\n", 1)
    path.write_text(json.dumps({**json.loads(head), **kw}) + "\n" + rest)


def test_a_part_numbered_past_belief_costs_no_memory(tmp_path: Path) -> None:
    """A last part's header whose number is 10**30 (a damaged digit run): the numbers
    missing were made as a set of range(1, 10**30), which took the machine's memory (the
    OOM killer ended llmtop report at 24 GB). Under a 2 GB limit here."""
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    _set_header(parts[-1], part=10**30)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, hard))
    try:
        src = resolve(stem)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert isinstance(src, Series) and src.files == tuple(parts)
    assert src.numbers[-1] == 10**30
    assert src.missing == (range(len(parts), 10**30),)
    note = next(n for n in src.notes if "missing" in n)
    assert f"parts {len(parts)}-{10**30 - 1} of {10**30} missing" in note
    with open_recording(src) as r:
        assert len(list(r)) == 60


@pytest.mark.parametrize(("numbers", "want"), [
    ((1, 2, 3), ()), ((2, 3), (range(1, 2),)), ((1, 4, 5, 9), (range(2, 4), range(6, 9))),
    ((1, 1, 2, 4), (range(3, 4),)),
])
def test_missing_parts_are_ranges(numbers: tuple[int, ...],
                                  want: tuple[range, ...]) -> None:
    from llmtop.recording.parts import missing_ranges

    assert missing_ranges(list(numbers)) == want
