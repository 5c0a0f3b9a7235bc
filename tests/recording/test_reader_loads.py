"""Recording lines are read by orjson, and by ``json`` where orjson refuses a line that
``json`` reads: every line reads to the values ``json.loads`` gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import T0, request

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader, loads_line
from llmtop.recording.writer import Recorder


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"x","v":0.00001,"w":1e-05,"u":"\\u00e9\\u2028","r":"\xc3\xa9"}',
        b'{"type":"x","v":NaN,"w":-Infinity}',  # json's extensions: orjson refuses them
        b'{"type":"x","s":"\\udcff"}',  # a lone surrogate escape
        b'{"type":"x","big":1e400}',
        b'  {"type":"x","n":null}  ',
    ],
)
def test_a_line_reads_as_json_reads_it(line: bytes) -> None:
    got, want = loads_line(line), json.loads(line)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize("line", [b'{"type":"x"', b'{"a":1} {"b":2}', b"\xff\xfe", b""])
def test_a_bad_line_raises_value_error_as_json_does(line: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(line)
    with pytest.raises(ValueError):
        loads_line(line)


def test_a_recording_with_a_line_only_json_reads_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    rec = Recorder(path, header={"upstream": "u"}, flush_s=0.2)
    rec.start()
    events = [request(i, T0 + i, n_chunks=5) for i in range(3)]
    rec.on_events(events)
    rec.stop()
    lines = path.read_bytes().splitlines(keepends=True)
    # a line another writer produced with json's NaN extension, inside the recording
    d = json.loads(lines[2])
    d["id"], d["e2e_s"] = "nan-line", float("nan")
    lines.insert(3, json.dumps(d).encode() + b"\n")
    path.write_bytes(b"".join(lines))
    with RecordingReader(path) as r:
        got = [e for e in r if isinstance(e, RequestRecord)]
    # the line is JSON to the reader (its NaN is then judged as any bad value is)
    assert not any("not JSON" in p for p in r.problems), r.problems
    assert [e.id for e in got if e.id != "nan-line"] == [e.id for e in events]
