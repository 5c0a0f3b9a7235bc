"""The footer's ``open_at_stop`` as read: a recording without it reads as before, a value
that cannot be a count is a bad footer count (ignored and said, as the others are), and a
rotated recording takes it from its last part (a count of the moment it stopped, not a
sum over the parts)."""

from __future__ import annotations

import json
from pathlib import Path

from rec_helpers import feed, session, write_recording

from llmtop.cli import main
from llmtop.recording.parts import Series, open_recording, resolve
from llmtop.recording.reader import RecordingReader
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.text import render_text
from llmtop.recording.writer import Recorder

SAID = "still open when the recording stopped"


def _footer(path: Path) -> dict[str, object]:
    foot = json.loads(path.read_text().splitlines()[-1])
    assert foot["type"] == "footer"
    return dict(foot)


def _set_footer(path: Path, **kw: object) -> None:
    lines = path.read_text().splitlines()
    lines[-1] = json.dumps({**json.loads(lines[-1]), **kw})
    path.write_text("\n".join(lines) + "\n")


def test_the_recorder_writes_the_count_it_is_given(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec = write_recording(path, session(20, duration_s=5), stop=False)
    assert rec.stop(open_at_stop=4)["open_at_stop"] == 4
    assert _footer(path)["open_at_stop"] == 4
    with RecordingReader(path) as r:
        for _ in r:
            pass
        assert r.summary()["open_at_stop"] == 4 and r.problems == []
    text = render_text(analyse(path))
    assert "4 requests were still open when the recording stopped; they are not in it" in text


def test_one_open_request_is_said_in_the_singular(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, session(20, duration_s=5), stop=False).stop(open_at_stop=1)
    assert ("1 request was still open when the recording stopped; it is not in it"
            in render_text(analyse(path)))


def test_a_recording_without_the_field_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    write_recording(path, session(20, duration_s=5))  # (stop() without a count)
    assert "open_at_stop" not in _footer(path)
    with RecordingReader(path) as r:
        for _ in r:
            pass
        s = r.summary()
    assert s["open_at_stop"] is None and s["complete"] and s["problems"] == []
    rep = analyse(path)
    assert rep["source"]["open_at_stop"] is None
    assert SAID not in render_text(rep)


def test_a_hostile_count_is_a_bad_footer_count(tmp_path: Path) -> None:
    for bad, why in ((-2, "-2, outside [0, "), (1e30, "1e+30, not an integer"),
                     ("3", "a string ('3'), not an integer"), (True, "")):
        path = tmp_path / f"h{len(why)}.jsonl"
        write_recording(path, session(20, duration_s=5))
        _set_footer(path, open_at_stop=bad)
        with RecordingReader(path) as r:
            for _ in r:
                pass
            s = r.summary()
            foot = r.footer
        assert foot is not None and foot["open_at_stop"] is None, bad
        assert s["open_at_stop"] is None and s["complete"], bad
        assert any(p.startswith(f"line {r.lines_read}: footer open_at_stop is {why}")
                   and p.endswith("; ignored") for p in s["problems"]), (bad, s["problems"])
        out = tmp_path / "r.json"
        assert main(["report", str(path), "-q", "--format", "json", "-o", str(out)]) == 0
        src = json.loads(out.read_text())["source"]
        assert src["open_at_stop"] is None, bad
        assert SAID not in render_text(analyse(path))


def test_a_rotated_recording_takes_its_last_parts_count(tmp_path: Path) -> None:
    stem = tmp_path / "p.jsonl"
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 40)
    rec.stop(open_at_stop=2)
    src = resolve(stem)
    assert isinstance(src, Series) and len(src.files) >= 3, src
    # a rotation carries its open requests into the next part: only the last part says
    assert ["open_at_stop" in _footer(f) for f in src.files] == (
        [False] * (len(src.files) - 1) + [True])
    with open_recording(src) as r:
        for _ in r:
            pass
        s = r.summary()
    assert s["open_at_stop"] == 2 and s["problems"] == [], s
    # (a part before the last that says a count — not this writer's — is not summed in)
    _set_footer(src.files[0], open_at_stop=7)
    with open_recording(resolve(stem)) as r:
        for _ in r:
            pass
        assert r.summary()["open_at_stop"] == 2
    assert "2 requests were still open" in render_text(analyse(stem))
