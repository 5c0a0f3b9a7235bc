"""Damaged recordings: a line with values no recorder writes (NaN, a string for a number, a
time far outside the recording) is skipped and counted by the reader — one check for report,
replay and both exports — and noted in the report; nothing hangs or prints a traceback."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord
from llmtop.recording.reader import RecordingReader, decode_event
from llmtop.recording.replay import IDLE_SKIP_S, ReplayEngine, ReplaySource
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.text import render_text
from llmtop.recording.validate import InvalidLine

DAY = 86400.0
DROP = object()  # remove the field


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], list[Event]]:
    """A small clean recording as parsed lines (header first), and its events."""
    path = tmp_path_factory.mktemp("dmg") / "base.jsonl"
    events = session(30, duration_s=8, errors_every=0, timeouts_every=0)
    write_recording(path, events)
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    return lines, events


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    # json.dumps writes NaN/Infinity literals, as a damaged or hand-edited file would hold
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def _damaged(base: tuple[list[dict[str, Any]], list[Event]], path: Path, kind: str,
             field: str, value: Any) -> tuple[Path, int, list[Event]]:
    """The base recording with one ``kind`` line's ``field`` set to ``value``; returns the
    path, the damaged line's number and the events that should still be read."""
    lines, events = base
    lines = [dict(d) for d in lines]
    idx = [i for i, d in enumerate(lines) if d["type"] == kind][3]
    if value is DROP:
        del lines[idx][field]
    else:
        lines[idx][field] = value
    gone = idx - 1  # the header is line 1 and not an event
    return _write(path, lines), idx + 1, events[:gone] + events[gone + 1:]


REQUEST_DAMAGE = [
    ("e2e_s", math.nan, "e2e_s is nan, not a finite number"),
    ("e2e_s", math.inf, "e2e_s is inf, not a finite number"),
    ("e2e_s", 1e12, "e2e_s is 1e+12, above 604800"),
    ("e2e_s", -0.5, "e2e_s is -0.5, below 0"),
    ("t_start", 1e15, "t_start is 1e+15, above 1e+10"),  # past any clock
    ("t_start", 5e9, "more than a day after the events around it"),  # the year 2128
    ("t_start", math.nan, "t_start is nan"),
    ("t_start", None, "t_start is null, not a number"),
    ("t_start", 1000.0, "more than a day before the recording started"),
    ("ttft_s", "fast", "ttft_s is a string ('fast'), not a number"),
    ("ttft_s", -1.0, "ttft_s is -1, below 0"),
    ("completion_tokens", -5, "completion_tokens is -5"),
    ("prompt_tokens", 1.5, "prompt_tokens is 1.5, not an integer"),
    ("user", 12345, "user is 12345, not a string"),
    ("outcome", DROP, "no outcome field"),
    ("outcome", "maybe", "outcome is a string ('maybe'), not one of"),
    # a value that cannot be a set member: the fast path's set test raised TypeError
    ("outcome", {"ok": 1}, "outcome is a dict, not one of"),
    ("outcome", ["ok"], "outcome is a list, not one of"),
    ("stream", "yes", "stream is a string ('yes'), not true/false"),
    ("chunk_offsets_s", [0.1, math.nan, 0.3], "chunk_offsets_s holds a value that is not finite"),
    ("chunk_offsets_s", [0.1, "0.2"], "chunk_offsets_s holds something that is not a number"),
    ("chunk_offsets_s", [0.1, 1e9], "chunk_offsets_s holds a value outside"),
    ("chunk_tokens", [1, 1.5], "chunk_tokens holds something that is not an integer"),
    # true sums as 1: read as a count, then export --parquet died (pyarrow: "got bool")
    ("chunk_tokens", [1, True, 1], "chunk_tokens holds something that is not an integer"),
    ("concurrency_at_start", 2**70, "concurrency_at_start is"),
]


@pytest.mark.parametrize(("field", "value", "reason"), REQUEST_DAMAGE,
                         ids=[f"{f}={v!r}"[:40] for f, v, _ in REQUEST_DAMAGE])
def test_a_request_line_with_impossible_values_is_skipped_and_said(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]], field: str,
        value: Any, reason: str) -> None:
    path, lineno, want = _damaged(base, tmp_path / "d.jsonl", "request", field, value)
    with RecordingReader(path) as r:
        assert list(r) == want
        assert (r.bad_lines, r.unknown_lines, r.truncated_lines) == (1, 0, 0)
        assert len(r.problems) == 1 and r.problems[0].startswith(f"line {lineno}: request")
        assert reason in r.problems[0]


READING_DAMAGE = [
    ("gpu", "index", "0", "index is a string ('0'), not an integer"),
    ("gpu", "t", math.nan, "t is nan"),
    ("gpu", "power_w", math.inf, "power_w is inf"),
    ("gpu", "name", DROP, "no name field"),
    ("engine", "raw", {"x": "y"}, "raw holds a value that is not a number"),
    ("engine", "ttft_buckets", [[0.1]], "not an [le, count] pair"),
    # integers past a float (OverflowError) or past int64 (Parquet's float64 column refused
    # them): out of range, as number() says of a time or a count
    ("engine", "raw", {"x": 10**400}, "raw holds an integer out of range"),
    ("engine", "raw", {"x": 2**63, "y": 1.5}, "raw holds an integer out of range"),
    ("engine", "running", "3", "running is a string"),
    ("warning", "state", "maybe", "state is a string ('maybe'), not raised or cleared"),
    ("warning", "t", 1e15, "t is 1e+15, above 1e+10"),  # past any clock
    ("warning", "t", 5e9, "more than a day after"),  # the year 2128
]


@pytest.mark.parametrize(("kind", "field", "value", "reason"), READING_DAMAGE,
                         ids=[f"{k}.{f}" for k, f, _, _ in READING_DAMAGE])
def test_a_reading_or_warning_with_impossible_values_is_skipped(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]], kind: str, field: str,
        value: Any, reason: str) -> None:
    lines, _ = base
    if kind == "warning":  # the base session has two warnings: damage the first
        lines = [dict(d) for d in lines]
        idx = next(i for i, d in enumerate(lines) if d["type"] == "warning")
        if value is DROP:
            del lines[idx][field]
        else:
            lines[idx][field] = value
        path = _write(tmp_path / "w.jsonl", lines)
        want = base[1][:idx - 1] + base[1][idx:]
    else:
        path, _, want = _damaged(base, tmp_path / "d.jsonl", kind, field, value)
    with RecordingReader(path) as r:
        assert list(r) == want
        assert r.bad_lines == 1 and reason in r.problems[0]


def test_decode_event_checks_without_the_time_span() -> None:
    with pytest.raises(InvalidLine, match="e2e_s is nan"):
        decode_event({"type": "request", "id": "x", "user": "u", "t_start": 1.0,
                      "e2e_s": math.nan, "outcome": "ok"})
    assert decode_event({"type": "footer", "ended_at": 1.0}) is None
    rec = decode_event({"type": "request", "id": "x", "user": "u", "t_start": 1,
                        "e2e_s": 2, "outcome": "ok"})
    assert isinstance(rec, RequestRecord) and rec.chunk_offsets_s == () and rec.status == 0


def test_missing_optional_fields_are_defaulted_and_counted(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    path, lineno, _ = _damaged(base, tmp_path / "d.jsonl", "request", "chunk_offsets_s", DROP)
    with RecordingReader(path) as r:
        back = list(r)
        assert len(back) == len(base[1]) and r.bad_lines == 0 and r.defaulted_lines == 1
        assert r.problems == [f"line {lineno}: request lacks fields; read with their defaults"]


def test_unknown_and_defaulted_lines_are_noted_in_the_report(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    lines = [dict(d) for d in base[0]]
    lines.insert(3, {"type": "bogus", "t": 1})
    req = next(d for d in lines if d["type"] == "request")
    del req["chunk_tokens"]
    text = render_text(analyse(_write(tmp_path / "u.jsonl", lines)))
    assert ("  file            1 line of an unknown type skipped; 1 request with missing "
            "fields (defaults used)") in text
    assert "line 4: unknown line type 'bogus'" in text
    assert "request lacks fields; read with their defaults" in text


def test_a_real_gap_is_kept_and_a_lone_outlier_is_not(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    lines = [dict(d) for d in base[0]]
    body, footer = lines[1:-1], lines[-1]
    assert footer["type"] == "footer"

    def shifted(d: dict[str, Any], by: float) -> dict[str, Any]:
        d = dict(d)
        for k in ("t", "t_start"):
            if k in d:
                d[k] += by
        return d

    # the same traffic again two days later (a proxy left recording over a weekend)
    later = [shifted(d, 2 * DAY) for d in body]
    end = {**footer, "ended_at": footer["ended_at"] + 2 * DAY}
    path = _write(tmp_path / "gap.jsonl", [lines[0], *body, *later, end])
    with RecordingReader(path) as r:
        assert len(list(r)) == 2 * len(body) and r.bad_lines == 0
    # one line two days ahead, with the rest carrying on as before: an outlier
    lone = [lines[0], *body[:5], shifted(body[5], 2 * DAY), *body[6:], footer]
    with RecordingReader(_write(tmp_path / "lone.jsonl", lone)) as r:
        assert len(list(r)) == len(body) - 1 and r.bad_lines == 1
    # the last event after a jump: kept when the footer agrees, dropped when it does not
    tail = [lines[0], *body, shifted(body[-1], 2 * DAY)]
    with RecordingReader(_write(tmp_path / "t1.jsonl", [*tail, end])) as r:
        assert len(list(r)) == len(body) + 1 and r.bad_lines == 0
    with RecordingReader(_write(tmp_path / "t2.jsonl", [*tail, footer])) as r:
        assert len(list(r)) == len(body) and r.bad_lines == 1


def test_header_values_that_cannot_be_right_are_ignored_and_said(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    lines = [dict(d) for d in base[0]]
    lines[0] = {**lines[0], "started_at": math.nan,
                "slo": {"ttft_s": math.nan, "itl_p95_s": 0.05, "target": 7}}
    path = _write(tmp_path / "h.jsonl", lines)
    with RecordingReader(path) as r:
        assert r.header["started_at"] is None and r.header["slo"] == {"itl_p95_s": 0.05}
        assert len(list(r)) == len(base[1]) and r.bad_lines == 0
        assert any("started_at is nan" in p for p in r.problems)
        assert any("slo ttft_s (nan)" in p for p in r.problems)
    rep = analyse(path)
    assert rep["conditions"]["slo"] == {"itl_p95_s": 0.05, "target": 0.95}
    assert rep["conditions"]["requests"] == 30 and rep["slo"]["attainment"] is not None


def test_a_header_objective_past_a_float_is_dropped_not_a_traceback(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """An integer of 400 digits as an SLO: math.isfinite raised OverflowError (a traceback
    from report, replay and both exports)."""
    lines = [dict(d) for d in base[0]]
    lines[0] = {**lines[0], "slo": {"ttft_s": 10**400, "itl_p95_s": 0.05}}
    path = _write(tmp_path / "h.jsonl", lines)
    with RecordingReader(path) as r:
        assert r.header["slo"] == {"itl_p95_s": 0.05}
        assert any("slo ttft_s (1000" in p for p in r.problems)
        assert len(list(r)) == len(base[1])
    assert main(["report", str(path), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["conditions"]["requests"] == 30
    assert main(["export", str(path), "-q", "--hlog", str(tmp_path / "h.hlog")]) == 0


def test_a_header_slo_that_is_not_an_object_is_said_plainly(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    """It read 'header slo is not an object is not an objective; ignored'."""
    lines = [dict(d) for d in base[0]]
    lines[0] = {**lines[0], "slo": [0.5]}
    with RecordingReader(_write(tmp_path / "h.jsonl", lines)) as r:
        assert r.header["slo"] == {}
        assert r.problems == ["line 1: header slo is a list, not an object; ignored"]
        assert len(list(r)) == len(base[1])


QA_DAMAGE = [("e2e_s", math.nan), ("e2e_s", math.inf), ("e2e_s", 1e12), ("t_start", 1e15),
             ("t_start", math.nan), ("t_start", None), ("ttft_s", "fast"),
             ("chunk_tokens", [1, True, 1])]


@pytest.mark.parametrize(("field", "value"), QA_DAMAGE,
                         ids=[f"{f}={v!r}" for f, v in QA_DAMAGE])
def test_report_and_exports_finish_and_skip_the_line(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]],
        capsys: pytest.CaptureFixture[str], field: str, value: Any) -> None:
    """They hung (a tick per second up to 1e12 s) or printed a traceback (exit 1)."""
    path, lineno, _ = _damaged(base, tmp_path / "d.jsonl", "request", field, value)
    t0 = time.monotonic()
    assert main(["report", str(path), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["bad_lines"] == 1 and doc["conditions"]["requests"] == 29
    assert doc["source"]["problems"][0].startswith(f"line {lineno}: request")
    assert doc["conditions"]["duration_s"] < 20
    assert main(["report", str(path), "-q"]) == 0
    assert "  file            1 bad line skipped" in capsys.readouterr().out
    assert main(["export", str(path), "-q", "--parquet", str(tmp_path / "pq")]) == 0
    assert main(["export", str(path), "-q", "--hlog", str(tmp_path / "o.hlog")]) == 0
    assert capsys.readouterr().err == ""
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "pq" / "requests.parquet").num_rows == 29
    assert time.monotonic() - t0 < 60


def test_replay_crosses_a_long_idle_stretch_in_one_step(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    lines = [dict(d) for d in base[0]]
    body = [d for d in lines[1:-1] if d["type"] == "request"]
    later = []
    for d in body:
        d = dict(d)
        d["t_start"] += 3 * DAY
        later.append(d)
    path = _write(tmp_path / "idle.jsonl", [lines[0], *body, *later])
    eng = ReplayEngine(path, tick_s=1.0)
    ticks = [0]
    eng.run_to_end(lambda now: ticks.__setitem__(0, ticks[0] + 1))
    assert eng.idle_skipped_s > 3 * DAY - IDLE_SKIP_S - 60
    assert ticks[0] < 200  # not 259,200 ticks
    snap = eng.snapshot(None)
    assert snap["system"]["requests"] == 2 * len(body)
    eng.close()


async def test_replay_source_far_past_the_end_does_not_tick_through_it(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]]) -> None:
    path = _write(tmp_path / "r.jsonl", base[0])
    src = ReplaySource(path, speed=1.0)
    src.engine.advance_to(src.engine.begin + 1e9)  # a seek far beyond a too-long estimate
    assert src.engine.finished and src.engine.idle_skipped_s > 1e8
    await src.close()


def test_nonfinite_cli_numbers_are_usage_errors(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]],
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "r.jsonl", base[0])
    for argv, message in (
        (["export", str(path), "--hlog", str(tmp_path / "o.hlog"), "--interval", "nan"],
         "--interval must be a finite number above 0, got nan"),
        (["export", str(path), "--hlog", str(tmp_path / "o.hlog"), "--interval", "inf"],
         "--interval must be a finite number above 0, got inf"),
        (["report", str(path), "--slo-ttft", "nan"],
         "--slo-ttft must be a finite number above 0, got nan"),
        (["report", str(path), "--slo-target", "nan"], "--slo-target must be in (0, 1]"),
        (["replay", str(path), "--speed", "inf"],
         "--speed must be a finite number above 0, got inf"),
        (["replay", str(path), "--start", "nan"], "--start must be ≥ 0, got nan"),
        (["report", str(path), "--slo-e2e", "1e9"], "--slo-e2e must be at most 86,400"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.hlog").exists()


def test_the_recorders_own_counts_are_noted_by_report_and_export(
        tmp_path: Path, base: tuple[list[dict[str, Any]], list[Event]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """The footer's ``dropped`` (events the recorder could not write: rows the tables lack)
    and ``out_of_order`` reach the user from both readers, not only the file."""
    lines = [dict(d) for d in base[0]]
    assert lines[-1]["type"] == "footer"
    lines[-1].update(dropped=3, out_of_order=1)
    path = _write(tmp_path / "c.jsonl", lines)
    note = "3 events dropped by the recorder; 1 line out of time order (written after a later one)"
    assert main(["report", str(path), "-q"]) == 0
    assert f"  file            {note}" in capsys.readouterr().out.splitlines()
    assert main(["export", str(path), "--hlog", str(tmp_path / "o.hlog")]) == 0
    assert f"llmtop export: note: c.jsonl: {note}" in capsys.readouterr().err.splitlines()
