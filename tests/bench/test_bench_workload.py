"""--workload files: what a line may say, and what it is taken to mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtop.bench.workload import FileEntry, WorkloadError, load_entries


def entries(tmp_path: Path, text: str) -> list[FileEntry]:
    p = tmp_path / "w.jsonl"
    p.write_text(text, encoding="utf-8")
    return load_entries(p)


@pytest.mark.parametrize("line", [
    '{"prompt_tokens": 5.7, "max_tokens": 4}',
    '{"prompt_tokens": 5, "max_tokens": 4.2}',
    '{"prompt_tokens": true, "max_tokens": 4}',
    '{"prompt_tokens": 5, "max_tokens": false}',
    '{"prompt": 5, "max_tokens": 4}',
    '{"prompt": ["a"], "max_tokens": 4}',
])
def test_a_count_that_is_not_a_whole_number_is_refused(tmp_path: Path, line: str) -> None:
    """A count of 5.7 was cut to 5 and ``true`` read as 1 token, a prompt of 5 sent as the
    text "5": the run measured another workload than the file's, and said nothing."""
    with pytest.raises(WorkloadError, match=r"w\.jsonl:1: not a workload line"):
        entries(tmp_path, line + "\n")


def test_whole_numbers_however_written_are_taken(tmp_path: Path) -> None:
    got = entries(tmp_path, '{"prompt_tokens": 5, "max_tokens": 4.0}\n'
                            '{"prompt": "hi there", "max_tokens": "7"}\n')
    assert got == [FileEntry(None, 5, 4), FileEntry("hi there", None, 7)]


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Windows editors (Notepad, PowerShell's Out-File) start UTF-8 with a byte order
    mark: the first line was "not a workload line (Unexpected UTF-8 BOM …)"."""
    p = tmp_path / "w.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"prompt_tokens": 5, "max_tokens": 4}\r\n'
                  b'{"prompt_tokens": 6, "max_tokens": 4}\r\n')
    assert load_entries(p) == [FileEntry(None, 5, 4), FileEntry(None, 6, 4)]


@pytest.mark.parametrize(("line", "says"), [
    ('{"prompt_tokens": 5}', "missing max_tokens"),
    ('{"max_tokens": 5}', "missing prompt or prompt_tokens"),
    ('[5, 4]', r"a JSON object, \{...\}, not list"),
    ('"hi"', r"a JSON object, \{...\}, not str"),
])
def test_a_missing_field_is_named(tmp_path: Path, line: str, says: str) -> None:
    """The line's error read "not a workload line ('max_tokens')" (a KeyError's repr),
    or for a line that is not an object "list indices must be integers or slices …"."""
    with pytest.raises(WorkloadError, match=rf"w\.jsonl:1: not a workload line \({says}\)$"):
        entries(tmp_path, line + "\n")
