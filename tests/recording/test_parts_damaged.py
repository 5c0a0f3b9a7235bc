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


def _empty(p: Path) -> str:
    p.write_bytes(b"")
    return "is empty"


def _garbage(p: Path) -> str:
    p.write_bytes(b"\x1f\x8b\x08" + bytes(range(256)) * 4)
    return "does not begin with a part's header"


def _no_header(p: Path) -> str:
    p.write_text(p.read_text().split("\n", 1)[1])
    return "does not begin with a part's header"


def _bad_start(p: Path) -> str:
    _set_header(p, started_at="noon")
    return "does not begin with a part's header"


def _directory(p: Path) -> str:
    p.unlink()
    p.mkdir()
    return "is not a file"


def _dangling(p: Path) -> str:
    p.unlink()
    p.symlink_to(p.with_name("gone.jsonl"))
    return "cannot be read (No such file or directory)"


@pytest.mark.parametrize("damage", [_empty, _garbage, _no_header, _bad_start, _directory,
                                    _dangling])
def test_a_part_that_is_there_but_unreadable_is_not_called_deleted(
        tmp_path: Path, damage: object) -> None:
    """A file named like part 3 that cannot be read as a part was left out with the note
    'part 3 of N missing (deleted by keep, or by hand)': the user was told it was gone
    while it was there, damaged."""
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    why = damage(parts[2])  # type: ignore[operator]
    src = resolve(stem)
    assert isinstance(src, Series) and src.files == tuple(parts[:2] + parts[3:])
    assert src.missing == (range(3, 4),)
    said = [n for n in src.notes if parts[2].name in n]
    assert said == [f"{stem}: {parts[2].name} is named like one of its parts but {why}: "
                    "left out"], src.notes
    missing = next(n for n in src.notes if "missing" in n)
    assert "deleted by keep, or by hand" not in missing, missing
    assert f"part 3 of {len(parts)} missing (deleted, or in a file left out)" in missing


def test_a_first_part_whose_start_is_after_its_events_reads_whole(tmp_path: Path) -> None:
    """The first part's header started_at days after its events: the part's reader
    ignores it (its events agree with each other), and so does the series' header."""
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    head = json.loads(parts[0].read_text().split("\n", 1)[0])
    _set_header(parts[0], started_at=head["started_at"] + 3 * 86400)
    src = resolve(stem)
    assert isinstance(src, Series) and src.files == tuple(parts)
    with open_recording(src) as r:
        assert len(list(r)) == 60 and r.bad_lines == 0
        assert r.header["started_at"] is None
        assert r.problems[0] == (f"{parts[0].name}: line 1: header started_at is more than "
                                 "a day after the events; ignored")


def _beside(part: Path) -> Path:
    """A free name of the part's stem, at the part's time (``p.<time>-77.jsonl``)."""
    stamp = part.name.split(".")[1].split("-")[0]
    return part.with_name(f"p.{stamp}-77.jsonl")


def test_a_copy_of_a_part_is_read_once(tmp_path: Path) -> None:
    """A part copied beside itself under another part's name (p.<time>-2.jsonl): both files
    were read, every request in it counted twice, without a word ('parts 1-3, 3-6')."""
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    copy = _beside(parts[2])
    copy.write_bytes(parts[2].read_bytes())
    src = resolve(stem)
    assert isinstance(src, Series) and src.files == tuple(parts)
    assert f"{stem}: {copy.name} is a copy of {parts[2].name} (part 3): left out" in src.notes
    with open_recording(src) as r:
        assert len(list(r)) == 60


def test_two_different_files_of_one_part_are_both_read_and_said(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    other = _beside(parts[2])
    lines = parts[2].read_text().splitlines()
    other.write_text("\n".join(lines[:-2]) + "\n")  # the same header, fewer lines
    src = resolve(stem)
    assert isinstance(src, Series) and set(src.files) == {*parts, other}
    assert any(n.startswith(f"{stem}: part 3 is in 2 files (") and n.endswith(
        "): each is read") for n in src.notes), src.notes
