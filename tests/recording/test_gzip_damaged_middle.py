"""A ``.jsonl.gz`` damaged in the middle (a bad disk block, a bad copy) reads up to the
damage, as one cut off by a crash does — but is said to be damaged, with where and how much
could not be read: it read "no footer: the recorder was killed or is still running" and
"the compressed data ends early (cut off by a crash...)", and a user took a recording of
23 s and 737 requests for one of 4.5 s and 190."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader

N = 400


def _recording(tmp_path: Path) -> Path:
    path = tmp_path / "whole.jsonl.gz"
    write_recording(path, session(N, duration_s=30))
    return path


def _damaged(tmp_path: Path, filler: bytes) -> tuple[Path, int, int]:
    """The recording with 4 kB at a third of it overwritten; (path, where, size)."""
    data = bytearray(_recording(tmp_path).read_bytes())
    at = len(data) // 3
    data[at:at + 4096] = (filler * 4096)[:4096]
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(bytes(data))
    return path, at, len(data)


@pytest.mark.parametrize("filler", [b"\0", b"\xff\x13"], ids=["zeros", "junk"])
def test_damage_in_the_middle_is_said_with_where(tmp_path: Path, filler: bytes,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path, at, size = _damaged(tmp_path, filler)
    with RecordingReader(path) as r:
        got = sum(isinstance(e, RequestRecord) for e in r)
        s = r.summary()
    assert 0 < got < N
    dmg = s["gzip_damage"]
    assert dmg is not None, s
    m = re.fullmatch(r"the compressed data is damaged: it stops decoding at byte ([\d,]+) "
                     r"of ([\d,]+), and the ([\d,]+) bytes from there on could not be read",
                     dmg)
    assert m is not None, dmg
    where, total, rest = (int(g.replace(",", "")) for g in m.groups())
    assert total == size and where + rest == size
    # (zlib may decode damaged bytes into junk for a while before it finds them wrong)
    assert at - 70_000 <= where < size

    assert main(["report", str(path), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["gzip_damage"] == dmg and doc["conditions"]["requests"] == got
    assert main(["report", str(path), "-q"]) == 0
    text = capsys.readouterr().out
    assert f"  file            {dmg}" in text
    assert "recorder was killed" not in text
    assert "(no footer read: the compressed data is damaged)" in text

    assert main(["export", str(path), "--hlog", str(tmp_path / "o.hlog")]) == 0
    err = capsys.readouterr().err
    assert f"note: damaged.jsonl.gz: {dmg}" in err, err
    assert "cut off by a crash" not in err


def test_a_zero_tail_after_a_crash_is_not_damage(tmp_path: Path) -> None:
    """Zeros to the end of the file (what a crash leaves): ends early, as before."""
    data = _recording(tmp_path).read_bytes()
    path = tmp_path / "z.jsonl.gz"
    path.write_bytes(data[:len(data) // 2] + b"\0" * (2 << 20))
    with RecordingReader(path) as r:
        assert sum(isinstance(e, RequestRecord) for e in r) > 0
        s = r.summary()
    assert s["gzip_incomplete"] and s["gzip_damage"] is None


def test_a_damaged_part_of_a_rotated_recording_is_named(tmp_path: Path) -> None:
    """The stem reads every part; the damaged one's damage is said with its name."""
    from rec_helpers import feed

    from llmtop.recording.parts import Series, open_recording, resolve
    from llmtop.recording.writer import Recorder

    stem = tmp_path / "p.jsonl.gz"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=2000)
    rec.start()
    feed(rec, 300)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 2, src
    hit = src.files[0]  # (not the last: the parts after it are still read)
    data = bytearray(hit.read_bytes())
    data[len(data) // 3:len(data) // 3 + 200] = b"\xff" * 200
    hit.write_bytes(bytes(data))
    with open_recording(src) as r:
        got = sum(isinstance(e, RequestRecord) for e in r)
        s = r.summary()
    after = sum(1 for f in src.files[1:] for e in open_recording(f)
                if isinstance(e, RequestRecord))
    assert after < got < 300  # the damaged part read up to its damage, the rest whole
    assert s["gzip_damage"] is not None
    assert s["gzip_damage"].startswith(f"{hit.name}: the compressed data is damaged: "), s
