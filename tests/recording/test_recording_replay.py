"""Replay: recorded events through the live Aggregator on a virtual clock — the same
figures as feeding the aggregator directly, in-flight rebuilt from the records, and the
TUI's controls (pause, seek, speed) driven through the real Textual app."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest
from rec_helpers import request, session, soon, write_recording

from llmtop.events import Event
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.errors import RecordingError
from llmtop.recording.replay import ReplayEngine, ReplaySource, config_for

METRICS = ("ttft", "itl", "chunk_gap", "tpot", "e2e")


class FakeWall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def overlapping(t0: float, n: int = 3) -> list[Event]:
    """n requests that start 1 s apart and each last 10 s: n in flight from t0+n-1."""
    recs = [request(i, t0 + i, ttft=0.5, gap=1.0, n_chunks=10, user=f"u{i}") for i in range(n)]
    return sorted(recs, key=lambda r: r.t_start + r.e2e_s)


def test_replay_gives_the_aggregators_own_figures(tmp_path: Path) -> None:
    events = session(300, duration_s=60)
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, events)
    eng = ReplayEngine(path)
    eng.run_to_end()
    replayed = eng.snapshot(None)
    direct = Aggregator(config_for(eng.header))
    direct.on_events(events)
    live = direct.snapshot(None)
    for m in METRICS:
        assert replayed["latency"][m] == live["latency"][m], m
    assert replayed["histograms"] == live["histograms"]
    assert replayed["system"]["requests"] == 300
    assert replayed["system"]["errors"] == live["system"]["errors"] > 0
    assert replayed["system"]["slo_attainment"] == live["system"]["slo_attainment"]
    assert replayed["capacity"]["bins"] == live["capacity"]["bins"]
    assert {u["user"] for u in replayed["users"]} == {"alice", "bob", "carol"}
    assert replayed["gpus"] and replayed["engine"]["kind"] == "sim"
    eng.close()


def test_in_flight_is_rebuilt_from_the_records(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    t0 = soon()
    write_recording(path, overlapping(t0, 3))
    eng = ReplayEngine(path, tick_s=0.25)
    eng.advance_to(t0 + 0.3)  # only r0 started, waiting for its first token (at +0.5)
    assert [a["state"] for a in eng.active_requests()] == ["waiting"]
    # no head has gone out yet: no status, and no prompt size (a live row's too)
    assert [(a["status"], a["prompt_tokens"]) for a in eng.active_requests()] == [(None, None)]
    eng.advance_to(t0 + 2.3)  # all three started; r0 and r1 streaming (last tick at +2.25)
    acts = {a["id"]: a for a in eng.active_requests()}
    assert set(acts) == {"r0", "r1", "r2"}
    assert acts["r0"]["state"] == "streaming" and acts["r1"]["state"] == "streaming"
    assert acts["r2"]["state"] == "waiting"  # its first token comes at +2.5
    # streaming rows show their status and prompt size, as live rows do (they were null)
    assert [(acts[r]["status"], acts[r]["prompt_tokens"]) for r in ("r0", "r1", "r2")] == [
        (200, 100), (200, 100), (None, None)]
    assert acts["r0"]["completion_tokens"] == 2  # chunks at +0.5, +1.5
    assert acts["r0"]["age_s"] == pytest.approx(2.3, abs=0.01)
    snap = eng.snapshot(10)
    assert snap["system"]["in_flight"] == 3 and snap["system"]["waiting"] == 1
    eng.run_to_end()
    assert eng.active_requests() == []
    final = eng.snapshot(None)
    assert final["system"]["in_flight_max"] == 3 and final["system"]["requests"] == 3
    # live TPS attribution while streaming + the correction at the end = the usage total
    assert final["system"]["output_tokens"] == 30


async def test_replay_source_plays_pauses_seeks_and_changes_speed(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    events = session(120, duration_s=60)
    write_recording(path, events)
    wall = FakeWall()
    src = ReplaySource(path, speed=10.0, wall=wall)
    assert src.duration_s is not None and src.duration_s > 60  # read from the file's tail

    async def go() -> None:
        snap = await src.fetch(None)
        assert snap["replay"]["position_s"] == pytest.approx(0.0, abs=0.6)
        wall.t += 3.0  # ×10: 30 s of recording
        snap = await src.fetch(60)
        assert src.position_s == pytest.approx(30.0, abs=0.6)
        n30 = snap["system"]["requests"]
        assert 0 < n30 < 120
        src.pause()
        wall.t += 5.0
        await src.fetch(60)
        assert src.position_s == pytest.approx(30.0, abs=0.6)
        src.seek(-20.0)  # backwards: the engine restarts and fast-forwards
        snap = await src.fetch(None)
        assert src.position_s == pytest.approx(10.0, abs=0.6)
        assert snap["system"]["requests"] < n30
        src.speed = 100.0
        src.resume()
        wall.t += 10.0  # far past the end: the picture holds at the end
        snap = await src.fetch(None)
        assert snap["system"]["requests"] == 120 and snap["replay"]["at_end"] is True
        assert src.position_s == pytest.approx(src.duration_s, abs=0.6)
        assert "×100" in src.describe()
        with pytest.raises(RecordingError, match="not available while replaying"):
            await src.recording("start", "x.jsonl")
        await src.close()

    await go()


async def test_a_gz_recordings_length_survives_a_seek_back(tmp_path: Path) -> None:
    """A .gz file's length is known only once it has been read to the end; a seek back
    rebuilds the engine, and the length must not be lost with it (QA: "replay 0s ×1")."""
    path = tmp_path / "s.jsonl.gz"
    write_recording(path, session(120, duration_s=60))
    wall = FakeWall()
    src = ReplaySource(path, speed=100.0, wall=wall)
    assert src.duration_s is None  # not read yet
    await src.fetch(None)
    wall.t += 10.0  # far past the end
    await src.fetch(None)
    length = src.duration_s
    assert length is not None and length > 59
    src.seek(-1e9)  # back to the start
    await src.fetch(None)
    assert src.position_s == pytest.approx(0.0, abs=0.6)
    assert src.duration_s == length
    await src.close()


def test_replay_source_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not a recording\n")
    with pytest.raises(RecordingError, match="not an llmtop recording"):
        ReplaySource(bad)
    good = tmp_path / "g.jsonl"
    write_recording(good, overlapping(soon(), 1))
    with pytest.raises(RecordingError, match="speed must be positive"):
        ReplaySource(good, speed=0)


async def test_the_tui_drives_a_replay(tmp_path: Path) -> None:
    """The real Textual app over a ReplaySource: the replay controls are live."""
    from llmtop.cli.replay import tui_source
    from llmtop.tui.app import LlmtopApp
    from llmtop.tui.source import ReplayControl, SnapshotSource

    path = tmp_path / "s.jsonl"
    write_recording(path, session(120, duration_s=60))
    src = tui_source(path, speed=1.0)
    assert isinstance(src, SnapshotSource) and isinstance(src, ReplayControl)

    async def go() -> None:
        app = LlmtopApp(src, refresh_hz=0, window_s=None)
        async with app.run_test(size=(160, 48)) as pilot:
            await app.refresh_now()
            await pilot.press("right", "right", "right")  # +30 s
            await app.refresh_now()
            assert 29.0 < src.position_s < 45.0  # +30 s of seeking plus real time (×1)
            assert app.view is not None and app.has_data
            await pilot.press("space")
            assert app.replay_paused
            await pilot.press("plus")
            assert src.speed > 1.0
            label = app._replay_label()
            assert label is not None and "replay" in label
            await pilot.press("q")

    await go()


def test_replay_cli_mistakes_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmtop.cli import main

    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    good = tmp_path / "g.jsonl"
    write_recording(good, overlapping(soon(), 1))
    assert main(["replay", str(good), "--speed", "0"]) == 2
    err = capsys.readouterr().err
    assert "--speed must be a finite number above 0" in err and len(err.strip().splitlines()) == 1


def _with_bad_lines(tmp_path: Path) -> Path:
    """A recording whose second line and a late line are not JSON."""
    good = tmp_path / "g.jsonl"
    write_recording(good, overlapping(soon(), 40))
    lines = good.read_bytes().splitlines()
    lines[1] = b'{"type":"request","id":'
    lines[-5] = b"\x00\x01 not json"
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_replay_says_what_it_skipped(tmp_path: Path) -> None:
    """report and export say which lines they skipped; replay said nothing."""
    path = _with_bad_lines(tmp_path)
    src = ReplaySource(path)
    src.engine.run_to_end()
    assert src.read_notes == ("2 bad lines skipped", "line 2: not JSON",
                              f"line {len(path.read_bytes().splitlines()) - 4}: not JSON")


def test_replay_cli_prints_what_it_skipped_when_it_ends(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmtop.cli import main

    path = _with_bad_lines(tmp_path)
    with warnings.catch_warnings():  # the file was left open (a ResourceWarning at exit)
        warnings.simplefilter("error", ResourceWarning)
        assert main(["replay", str(path)]) == 2  # (no terminal here: it ends at once)
        gc.collect()
    err = capsys.readouterr().err
    assert "the TUI needs a terminal" in err
    assert "llmtop replay: bad.jsonl: 1 bad line skipped" in err  # (read so far)
    assert "llmtop replay: bad.jsonl: line 2: not JSON" in err
