"""Lines no recorder writes but a damaged or hand-edited file can hold: each is skipped (or
its value ignored) and said, and nothing is printed as a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import feed, session, write_recording

from llmtop.cli import main
from llmtop.recording.errors import RecordingError
from llmtop.recording.parts import Series, resolve
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder

DEEP = b"[" * 5000 + b"]" * 5000
"""JSON nested deeper than any parser recurses (orjson stops at 1,024, json at Python's
recursion limit): json.loads raised RecursionError, which no reader caught."""


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def test_a_deeply_nested_line_is_a_bad_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, session(20, duration_s=5))
    lines = _lines(path)
    path.write_bytes(b"\n".join([lines[0], b'{"type":"request","user":' + DEEP + b"}",
                                 DEEP, *lines[1:]]))
    with RecordingReader(path) as r:
        n = sum(1 for _ in r)
        assert n == len([x for x in lines[1:] if x]) - 1  # every event (not the footer)
        assert r.bad_lines == 2
        assert r.problems == ["line 2: JSON nested too deeply (not a recording's line)",
                              "line 3: JSON nested too deeply (not a recording's line)"]
    assert main(["report", str(path), "-q", "--format", "json",
                 "-o", str(tmp_path / "r.json")]) == 0
    src = json.loads((tmp_path / "r.json").read_text())["source"]
    assert src["bad_lines"] == 2
    assert main(["export", str(path), "-q", "--hlog", str(tmp_path / "r.hlog")]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_deeply_nested_first_line_is_not_a_recording(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(DEEP + b"\n")
    with pytest.raises(RecordingError, match=r"r\.jsonl: not an llmtop recording"):
        RecordingReader(path)
    assert main(["report", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmtop report: error: r.jsonl: not an llmtop recording"), err


def test_a_part_beginning_deeply_nested_is_left_out(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    parts = list(src.files)
    parts[1].write_bytes(DEEP + b"\n")
    src = resolve(stem)
    assert isinstance(src, Series) and parts[1] not in src.files
    assert any(f"{parts[1].name} is named like one of its parts but does not begin with a "
               "part's header: left out" in n for n in src.notes), src.notes


def _set_footer(path: Path, **kw: object) -> None:
    lines = path.read_text().splitlines()
    foot = json.loads(lines[-1])
    assert foot["type"] == "footer"
    lines[-1] = json.dumps({**foot, **kw})
    path.write_text("\n".join(lines) + "\n")


def test_a_footer_count_that_cannot_be_one_is_ignored_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The footer's counts went out as they were: report --format json gave
    dropped_by_recorder -3 and out_of_order_lines "x", and a stem summed a part's -3 in."""
    path = tmp_path / "r.jsonl"
    write_recording(path, session(20, duration_s=5))
    _set_footer(path, dropped=-3, out_of_order="x", requests=1e30, lines=2**50,
                dropped_requests=None)
    with RecordingReader(path) as r:
        assert sum(1 for _ in r) > 20
        s = r.summary()
        foot = r.footer
    assert foot is not None
    assert (foot["dropped"], foot["out_of_order"], foot["requests"], foot["lines"]) == (
        None, None, None, None)
    assert s["dropped_by_recorder"] is None and s["out_of_order_lines"] is None
    assert s["bad_lines"] == 0
    assert s["problems"] == [
        f"line {r.lines_read}: footer requests is 1e+30, not an integer; ignored",
        f"line {r.lines_read}: footer lines is {2**50}, outside [0, {2**40}]; ignored",
        f"line {r.lines_read}: footer dropped is -3, outside [0, {2**40}]; ignored",
        f"line {r.lines_read}: footer out_of_order is a string ('x'), not an integer; "
        "ignored",
    ]
    out = tmp_path / "r.json"
    assert main(["report", str(path), "-q", "--format", "json", "-o", str(out)]) == 0
    src = json.loads(out.read_text())["source"]
    assert src["dropped_by_recorder"] is None and src["out_of_order_lines"] is None
    assert main(["export", str(path), "--hlog", str(tmp_path / "r.hlog")]) == 0
    assert "footer dropped is -3" in capsys.readouterr().err


def test_a_parts_negative_footer_count_is_not_summed(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    _set_footer(src.files[0], dropped=-5)
    from llmtop.recording.parts import open_recording

    with open_recording(src) as r:
        for _ in r:
            pass
        s = r.summary()
    assert s["dropped_by_recorder"] is None, s  # not the parts' sum with -5 in it
    assert any("footer dropped is -5, outside" in p for p in s["problems"]), s["problems"]


def test_a_damaged_byte_in_the_header_does_not_refuse_the_recording(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One byte of the header's upstream turned to 0xff (not UTF-8): every reader refused
    the whole recording ('not an llmtop recording (the first line is not JSON)'). The header
    is read with U+FFFD in the byte's place, and that is said; a request line so damaged
    is skipped, and said to be not UTF-8, not 'not JSON'."""
    path = tmp_path / "r.jsonl"
    write_recording(path, session(20, duration_s=5))
    lines = _lines(path)
    assert b'"upstream":"http://' in lines[0]
    lines[0] = lines[0].replace(b'"upstream":"http://', b'"upstream":"ht\xfftp://')
    k = next(i for i, x in enumerate(lines) if b'"type":"request"' in x)
    lines[k] = lines[k].replace(b'"user":"', b'"user":"\xc3', 1)
    path.write_bytes(b"\n".join(lines))
    with RecordingReader(path) as r:
        assert r.header["upstream"] == "ht\ufffdtp://127.0.0.1:9/v1"
        n = sum(1 for _ in r)
        assert n == len([x for x in lines[1:] if x]) - 2  # not the footer, not line k
        assert r.bad_lines == 1
        at, h_at = lines[k].index(b"\xc3") + 1, lines[0].index(b"\xff") + 1
        assert r.problems == [
            f"line 1: not valid UTF-8 (byte 0xff at byte {h_at}); read with U+FFFD in its "
            "place",
            f"line {k + 1}: not valid UTF-8 (byte 0xc3 at byte {at})",
        ], r.problems
    assert main(["report", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"not valid UTF-8 (byte 0xff at byte {h_at})" in out


def test_a_part_with_a_damaged_byte_in_its_header_is_read_in_its_stem(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    parts = list(src.files)
    data = parts[1].read_bytes()
    parts[1].write_bytes(data.replace(b'"upstream":"http', b'"upstream":"\xffttp', 1))
    src = resolve(stem)
    assert isinstance(src, Series) and list(src.files) == parts, src.notes
    from llmtop.recording.parts import open_recording

    with open_recording(src) as r:
        assert sum(1 for e in r if type(e).__name__ == "RequestRecord") == 40
        assert any(p.startswith(f"{parts[1].name}: line 1: not valid UTF-8")
                   for p in r.summary()["problems"]), r.summary()["problems"]


def test_a_part_beginning_with_a_utf8_byte_order_mark_is_read_in_its_stem(
        tmp_path: Path) -> None:
    """(An editor's re-save can put one there; json.loads of the bytes skips it, of a str
    does not: 01d69d5 decoded the header to a str first and left such a part out.)"""
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    parts = list(src.files)
    parts[1].write_bytes(b"\xef\xbb\xbf" + parts[1].read_bytes())
    src = resolve(stem)
    assert isinstance(src, Series) and list(src.files) == parts, src.notes
