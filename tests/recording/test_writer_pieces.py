"""The recorder with long answers (16k-token reasoning streams):

- a line is encoded by orjson (a 16k-chunk record: ~1 ms, where ``json.dumps`` took 9),
  its long chunk lists in pieces, so the GIL can pass between them (one ``json.dumps`` of
  a 16k-chunk record held it 8–20 ms: the proxy's forwarding thread waited that long);
  the line holds exactly the values one ``json.dumps`` wrote (float for float, NaN/inf
  as null), compact, on one line; what orjson refuses goes through ``json`` as before;
- the queue is bounded by the records' chunks as well as by events (a stalled disk with
  100,000 queued long answers would hold tens of GB): what does not fit is dropped and
  counted, as for a full queue.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rec_helpers import T0, request

import llmtop.recording.writer as writer
from llmtop.events import GpuReading, RequestRecord, WarningEvent
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder, dumps_line, event_dict


def _one_call(d: Any) -> bytes:
    """The line as the recorder wrote it before: one json.dumps call (NaN/inf → null)."""
    def finite(o: Any) -> Any:
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {k: finite(v) for k, v in o.items()}
        if isinstance(o, list | tuple):
            return [finite(v) for v in o]
        return o
    try:
        s = json.dumps(d, separators=(",", ":"), allow_nan=False)
    except ValueError:
        s = json.dumps(finite(dict(d)), separators=(",", ":"), allow_nan=False)
    return s.encode() + b"\n"


def same_line(line: bytes, d: Any) -> None:
    """``line`` is one line holding what one json.dumps call wrote."""
    want = _one_call(d)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    got_v = json.loads(line, parse_constant=_no_constants)  # no NaN / Infinity
    want_v = json.loads(want)
    assert got_v == want_v
    assert _signs(got_v) == _signs(want_v)  # -0.0 stays -0.0


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} written")


def _signs(o: Any) -> Any:
    if isinstance(o, float):
        return math.copysign(1.0, o)
    if isinstance(o, dict):
        return {k: _signs(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_signs(v) for v in o]
    return None


def _long(n: int, seed: int = 3, **kw: Any) -> RequestRecord:
    rnd = random.Random(seed)
    offs, t = [], 0.02
    for _ in range(n):
        t += 0.003 + rnd.random() * 0.0003
        offs.append(t)
    toks = [1] * n
    if n:
        toks[-1] = 2
    base: dict[str, Any] = {
        "id": "r-\"ü☃\"\n", "user": "ünï\u2028cøde", "model": "m", "dialect": "openai",
        "path": "/v1/chat/completions", "stream": True, "status": 200, "outcome": "ok",
        "t_start": T0, "ttft_s": offs[0] if offs else None, "e2e_s": t, "prompt_tokens": 37,
        "completion_tokens": sum(toks), "token_source": "usage",
        "chunk_offsets_s": tuple(offs), "chunk_tokens": tuple(toks),
        "concurrency_at_start": 3, "error": None}
    base.update(kw)
    return RequestRecord(**base)


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 2047, 2048, 2049, 16_387])
def test_a_record_line_holds_what_one_json_dumps_wrote(n: int) -> None:
    rec = _long(n)
    d = event_dict(rec)
    same_line(dumps_line(d), d)
    assert dumps_line(rec.to_json_dict()) == dumps_line(d)
    assert RequestRecord.from_json_dict(json.loads(dumps_line(d))) == rec
    assert "ünï\u2028cøde".encode() in dumps_line(d)  # UTF-8, not escapes


def test_odd_values_in_and_around_long_lists_are_written_as_before() -> None:
    """Values orjson refuses (2**70, a non-string key) send the line through json."""
    odd = [1e-5, 1e22, -0.0, 5e-324, 0.1 + 0.2, 1.7976931348623157e308, 2**70, True, None,
           "ü\x00", [1, [2.5]], {"k": 1}]
    long = (odd * 300)[:3001]
    cases: list[dict[Any, Any]] = [
        {"type": "x", "a": long, "b": tuple(long), "s": "é\"\\", "n": None},
        {"type": "x", "a": [float("nan")] + [1.0] * 2000, "inf": float("inf")},  # → null
        {"type": "x", "a": [1.0] * 2000, "z": [float("-inf")]},
        {1: [0.5] * 3000, "s": 1},  # a key JSON converts: left to json whole
        {"empty": [], "short": [1, 2], "long": list(range(5000))},
        {"type": "x", "user": "a\udcffb", "l": [0.5] * 3000},  # a lone surrogate: json's
    ]
    for d in cases:
        same_line(dumps_line(d), d)
    for d in cases[1:3] + cases[4:5]:  # orjson's: no 2**70, no int key
        assert b"\\u" not in dumps_line(d)
    assert dumps_line(cases[0]) == _one_call(cases[0])  # 2**70: json's, byte for byte
    assert dumps_line(cases[3]) == _one_call(cases[3])
    assert dumps_line(cases[5]) == _one_call(cases[5])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(-2**60, 2**60)), min_size=1, max_size=60),
       st.integers(900, 2600), st.text(max_size=8))
def test_any_long_list_is_written_as_one_json_dumps_wrote_it(base: list[Any], n: int,
                                                             s: str) -> None:
    xs = (base * (n // len(base) + 1))[:n]
    d = {"type": "request", "id": s, "chunk_offsets_s": tuple(xs), "chunk_tokens": xs[::-1]}
    same_line(dumps_line(d), d)


def test_no_single_encoder_call_takes_more_than_a_piece(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    piece = getattr(writer, "PIECE", 1024)
    longest = [0]
    real = writer._odumps

    def spy(obj: Any, *a: Any, **kw: Any) -> bytes:
        seqs = [obj] if isinstance(obj, list | tuple) else (
            list(obj.values()) if isinstance(obj, dict) else [])
        for v in seqs:
            if isinstance(v, list | tuple):
                longest[0] = max(longest[0], len(v))
        return real(obj, *a, **kw)

    d = event_dict(_long(16_384))
    monkeypatch.setattr(writer, "_odumps", spy)
    line = dumps_line(d)
    monkeypatch.undo()
    same_line(line, d)
    assert 0 < longest[0] <= piece  # one call took 16,384 offsets before


def test_the_recording_file_holds_the_same_lines(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    rec = Recorder(path, header={"upstream": "u"}, flush_s=0.2)
    rec.start()
    events = [_long(3000, seed=i, id=f"r{i}", t_start=T0 + i) for i in range(4)]
    rec.on_events(events)
    rec.stop()
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines[1:5] == [dumps_line(event_dict(e)) for e in events]
    for line, e in zip(lines[1:5], events, strict=True):
        same_line(line, event_dict(e))
    with RecordingReader(path) as r:
        assert [e for e in r if isinstance(e, RequestRecord)] == events


def _gpu(t: float) -> GpuReading:
    return GpuReading(t=t, index=0, name="H200", mem_used_bytes=1, mem_total_bytes=2)


def test_the_queue_is_bounded_by_chunks_and_counts_what_it_drops(tmp_path: Path) -> None:
    path = tmp_path / "bounded.jsonl"
    # flush_s 400: the writer thread sleeps through the test (a stalled disk), then stop()
    # writes what was queued
    rec = Recorder(path, header={"upstream": "u"}, flush_s=400.0, queue_max_chunks=5_000)
    rec.start()
    try:
        long = [request(i, T0 + i, n_chunks=1_000) for i in range(8)]
        rec.on_events(long[:3])  # 3,000 chunks: fit
        assert rec.queued_chunks == 3_000 and rec.dropped == 0
        w = WarningEvent(t=T0, code="QUEUEING", severity="warning", message="m",
                         state="raised")
        rec.on_events([long[3], _gpu(T0), long[4], long[5], w, long[6]])
        # 2 more records fit (5,000 chunks); 6 does not, nor 7; the small events do
        assert rec.queued_chunks == 5_000
        assert (rec.dropped, rec.dropped_requests) == (2, 2)
        assert rec.status()["queued"] == 7
        rec.on_events([request(100, T0, n_chunks=0), _gpu(T0 + 1)])  # no chunks: still fit
        assert rec.status()["queued"] == 9
        rec.on_events([long[7]])
        assert (rec.dropped, rec.dropped_requests) == (3, 3)
    finally:
        final = rec.stop()
    assert rec.queued_chunks == 0
    assert (final["requests"], final["dropped"], final["dropped_requests"]) == (6, 3, 3)
    with RecordingReader(path) as r:
        ids = [e.id for e in r if isinstance(e, RequestRecord)]
        assert r.footer is not None and r.footer["dropped_requests"] == 3
    # in time order (tests/recording/test_recording_order.py): r100, with no chunks, ended
    # first
    assert ids == ["r100", "r0", "r1", "r2", "r3", "r4"]


def test_a_record_larger_than_the_bound_still_goes_into_an_empty_queue(
        tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "big.jsonl", header={}, flush_s=400.0, queue_max_chunks=100)
    rec.start()
    try:
        rec.on_events([request(1, T0, n_chunks=500), request(2, T0, n_chunks=1)])
        assert rec.queued_chunks == 500 and rec.dropped == 1
    finally:
        final = rec.stop()
    assert final["requests"] == 1 and rec.queued_chunks == 0
    rec2 = Recorder(tmp_path / "count.jsonl", header={}, flush_s=400.0, queue_max=2,
                    queue_max_chunks=10_000)
    rec2.start()
    try:  # the count bound is kept as before: the first events that fit, the rest dropped
        rec2.on_events([request(i, T0, n_chunks=10) for i in range(5)] + [_gpu(T0)])
        assert (rec2.dropped, rec2.dropped_requests, rec2.queued_chunks) == (4, 3, 20)
    finally:
        assert rec2.stop()["requests"] == 2
    with pytest.raises(ValueError, match="queue_max_chunks"):
        Recorder(tmp_path / "x.jsonl", header={}, queue_max_chunks=0)
