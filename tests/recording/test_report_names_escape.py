"""`llmtop report` text never sends a client's control sequence to the terminal: user and
model names, error texts and header values with ESC/OSC/CSI, C1, BEL, NUL or bidi
overrides are shown with visible escapes; the per-user table stays aligned (by terminal
cells, CJK names included)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording
from rich.cells import cell_len

from llmtop.cli import main
from llmtop.recording.report.text import table

HOSTILE_USERS = ["\x1b]0;PWNED-TITLE\x1b\\", "\x1b]52;c;cHduZWQ=\x07", "\x1b[2J\x1b[Hclear",
                 "c1\x9b2J", "abc\u202eevil\u202c", "nul\x00x", "日本語のユーザー名", "alice"]
HOSTILE_MODEL = "\x1b[8mhidden-model"
CONTROL = frozenset([*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F),
                     *range(0x2066, 0x206A)]) - {ord("\n")}


def hostile_recording(path: Path) -> None:
    t0 = soon()
    recs = [request(i, t0 + i * 0.05, user=u, model=HOSTILE_MODEL if i % 2 else "m")
            for i, u in enumerate(HOSTILE_USERS * 2)]
    recs.append(dataclasses.replace(request(99, t0 + 1, user="alice", outcome="error"),
                                    error="upstream said \x1b]52;c;ZXZpbA==\x07 \x1b[31mno"))
    write_recording(path, recs, header={"upstream": "http://h/\x1b[2J",
                                        "slo": {"ttft_s": 0.5}})


def test_report_text_has_no_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    hostile_recording(path)
    capsys.readouterr()
    assert main(["report", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert not CONTROL & set(map(ord, out)), sorted(CONTROL & set(map(ord, out)))
    assert "\\x1b]0;PWNED-TITLE\\x1b\\" in out
    assert "\\x1b]52;c;cHduZWQ=\\x07" in out
    assert "\\x1b[8mhidden-model" in out  # models
    assert "\\x1b]52;c;ZXZpbA==\\x07" in out  # the error text
    assert "http://h/\\x1b[2J" in out  # the header's upstream
    assert "abcevil" in out and "nul\\x00x" in out and "c1\\x9b2J" in out
    per_user = out.split("PER USER", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    # aligned: the last column is right-aligned, so every line ends at the same cell
    assert len(per_user) == len(HOSTILE_USERS) + 1
    assert len({cell_len(line) for line in per_user}) == 1, "\n".join(per_user)


def test_compare_text_has_no_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    hostile_recording(a)
    hostile_recording(b)
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q"]) == 0
    out = capsys.readouterr().out
    assert not CONTROL & set(map(ord, out)), sorted(CONTROL & set(map(ord, out)))
    assert "\\x1b[8mhidden-model" in out


def test_table_pads_by_cells() -> None:
    lines = table([["日本語", "1"], ["ab", "22"]], ("user", "n"))
    assert [cell_len(line) for line in lines] == [12, 12, 12]  # indent, 6, gap, 2
    assert table([["\x1b[2J", "1"]], ("u", "n"))[1] == "  \\x1b[2J  1"


def test_report_json_escapes_every_control_and_keeps_each_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--format json` to a terminal: C1 (U+009B is a CSI on some terminals), DEL and
    bidi controls are written as JSON ``\\uXXXX`` escapes like C0 already is, so nothing
    acts on the terminal; parsed back, every name is exactly the recorded one."""
    import json

    path = tmp_path / "r.jsonl"
    hostile_recording(path)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    out = capsys.readouterr().out
    assert not CONTROL & set(map(ord, out)), sorted(CONTROL & set(map(ord, out)))
    assert "日本語のユーザー名" in out  # readable, not \\u-escaped
    assert "\\u009b" in out and "\\u202e" in out
    text = json.dumps(json.loads(out), ensure_ascii=False)
    for user in HOSTILE_USERS:
        assert json.dumps(user, ensure_ascii=False) in text, user


def test_report_html_has_no_control_characters(tmp_path: Path) -> None:
    """The HTML report (its tables and its plots' SVG text) shows a client's control
    characters as the text report does, ``\\xNN``, and drops bidi overrides: an RLO in a
    user name drew the cells after it reversed in the browser, and a raw ESC reached the
    plots. A CJK user name in the plots warns of no missing glyph (the suite makes a
    warning an error): the SVG's text is drawn by the browser's fonts."""
    path, out = tmp_path / "r.jsonl", tmp_path / "r.html"
    hostile_recording(path)
    assert main(["report", str(path), "--format", "html", "-o", str(out), "-q"]) == 0
    page = out.read_text(encoding="utf-8")
    hostile = frozenset([0x00, 0x07, 0x1B, 0x9B, 0x202C, 0x202E])
    assert not hostile & set(map(ord, page)), sorted(hostile & set(map(ord, page)))
    assert "\\x1b]0;PWNED-TITLE\\x1b\\" in page  # a user: shown, escaped
    assert "\\x1b[8mhidden-model" in page  # a model
    assert "abcevil" in page and "日本語のユーザー名" in page
