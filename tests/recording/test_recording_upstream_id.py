"""A request's ``upstream_id`` (the engine's own id of it) in a recording: written, read
back, exported to Parquet; a recording from before the field reads it as null — neither
damaged nor "defaulted" — and exports a null column."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rec_helpers import request, soon, write_recording

from llmtop.events import Event, RequestRecord
from llmtop.recording.parquet import REQUESTS_SCHEMA, export_parquet
from llmtop.recording.reader import RecordingReader

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
IDS = ["chatcmpl-9f1c2e", None, "msg_01XFDUDYJgAACzvnptvVoYEL", "req-café-" + "x" * 119]


def _events() -> list[Event]:
    t = soon()
    return [dataclasses.replace(request(i, t + i), upstream_id=uid)
            for i, uid in enumerate(IDS)]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_upstream_id_round_trips(tmp_path: Path, suffix: str) -> None:
    events = _events()
    path = tmp_path / f"s{suffix}"
    write_recording(path, events)
    with RecordingReader(path) as r:
        back = list(r)
        summary = r.summary()
    assert back == events
    assert [e.upstream_id for e in back if isinstance(e, RequestRecord)] == IDS
    assert summary["defaulted_lines"] == summary["bad_lines"] == 0
    if suffix == ".jsonl":
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert [d.get("upstream_id", "absent") for d in lines if d["type"] == "request"] == IDS


def test_a_recording_from_before_the_field_reads_null(tmp_path: Path) -> None:
    events = _events()
    path = tmp_path / "new.jsonl"
    write_recording(path, events)
    old = tmp_path / "old.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:
        d.pop("upstream_id", None)
    old.write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert "upstream_id" not in old.read_text()
    with RecordingReader(old) as r:
        back = list(r)
        summary = r.summary()
    assert back == [dataclasses.replace(e, upstream_id=None)
                    for e in events if isinstance(e, RequestRecord)]
    assert summary["defaulted_lines"] == summary["bad_lines"] == 0
    # a recording llmtop wrote before the field existed
    with RecordingReader(FIXTURES / "sim_tiny_short.jsonl") as r:
        recs = [e for e in r if isinstance(e, RequestRecord)]
        assert r.summary()["bad_lines"] == 0
    assert recs and {e.upstream_id for e in recs} == {None}


def test_a_wrong_type_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_recording(path, _events())
    lines = path.read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if '"upstream_id":"chatcmpl' in x)
    d = json.loads(lines[i])
    d["upstream_id"] = 7
    lines[i] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")
    with RecordingReader(path) as r:
        back = [e for e in r if isinstance(e, RequestRecord)]
        assert r.summary()["bad_lines"] == 1
    assert [e.upstream_id for e in back] == IDS[1:]


def test_parquet_has_the_column(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, _events())
    export_parquet(path, tmp_path / "pq")
    table = pq.read_table(tmp_path / "pq" / "requests.parquet")
    assert table.schema.field("upstream_id").type == REQUESTS_SCHEMA.field("upstream_id").type
    assert table.column("upstream_id").to_pylist() == IDS
    # a recording from before the field: the column is there, null
    export_parquet(FIXTURES / "sim_tiny_short.jsonl", tmp_path / "old")
    old = pq.read_table(tmp_path / "old" / "requests.parquet").column("upstream_id")
    assert len(old) > 0 and old.null_count == len(old)
