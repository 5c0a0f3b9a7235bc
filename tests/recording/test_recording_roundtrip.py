"""Writer → reader round trips, crash tolerance, and what the reader refuses."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path
from typing import IO

import pytest
from rec_helpers import T0, request, session, write_recording

from llmtop.bus import EventBus
from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent
from llmtop.recording.errors import RecordingError
from llmtop.recording.reader import RecordingReader, iter_recording, read_header
from llmtop.recording.writer import Recorder, RecordingController

SUFFIXES = [".jsonl", ".jsonl.gz"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_every_event_type(tmp_path: Path, suffix: str) -> None:
    events = session(120)
    path = tmp_path / f"s{suffix}"
    rec = write_recording(path, events, header={"upstream": "http://up", "slo": {"ttft_s": 0.5},
                                                "model_hint": "m-8b"})
    assert rec.status()["requests"] == 120
    with RecordingReader(path) as r:
        assert r.header["format"] == "llmtop-recording" and r.header["version"] == 1
        assert r.header["upstream"] == "http://up" and r.header["slo"] == {"ttft_s": 0.5}
        assert r.header["model_hint"] == "m-8b" and r.header["llmtop_version"]
        back = list(r)
        assert r.footer is not None and r.footer["requests"] == 120
        assert r.footer["dropped"] == 0
        assert r.summary()["truncated_lines"] == 0 and r.complete
    assert back == events
    kinds = {type(e) for e in back}
    assert kinds == {RequestRecord, GpuReading, EngineReading, WarningEvent}
    if suffix.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_iter_recording_yields_header_events_footer(tmp_path: Path) -> None:
    events = session(10, duration_s=3)
    path = tmp_path / "s.jsonl"
    write_recording(path, events)
    items = list(iter_recording(path))
    assert isinstance(items[0], dict) and items[0]["type"] == "header"
    assert isinstance(items[-1], dict) and items[-1]["type"] == "footer"
    assert items[1:-1] == events


def test_nan_becomes_null_and_no_text_is_written(tmp_path: Path) -> None:
    path = tmp_path / "nan.jsonl"
    rec = Recorder(path, header={"upstream": "u"})
    rec.start()
    r = request(1, T0)
    rec.on_events([GpuReading(t=T0, index=0, name="g", mem_used_bytes=1, mem_total_bytes=2,
                              power_w=float("nan"), dram_bw_util=float("inf")), r])
    rec.stop()
    lines = path.read_text().splitlines()
    gpu = json.loads(lines[1])
    assert gpu["power_w"] is None and gpu["dram_bw_util"] is None
    req = json.loads(lines[2])
    assert not {"prompt", "messages", "completion", "text", "content"} & set(req)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_cut_off_last_line_is_ignored_and_counted(tmp_path: Path, suffix: str) -> None:
    events = session(40, duration_s=5)
    full = tmp_path / "full.jsonl"
    write_recording(full, events)
    raw = full.read_bytes()
    lines = raw.split(b"\n")
    # drop the footer and cut the last event line in half: a crash mid-write
    cut = b"\n".join(lines[:-3]) + b"\n" + lines[-3][: len(lines[-3]) // 2]
    path = tmp_path / f"cut{suffix}"
    if suffix.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(cut)
    else:
        path.write_bytes(cut)
    with RecordingReader(path) as r:
        back = list(r)
        assert r.truncated_lines == 1 and r.footer is None and not r.complete
    assert back == events[:-1]


def test_killed_gzip_recording_reads_back_to_last_sync_flush(tmp_path: Path) -> None:
    """A .gz whose writer never closed it (no gzip trailer) still reads: Z_SYNC_FLUSH."""
    path = tmp_path / "live.jsonl.gz"
    events = session(30, duration_s=3)
    rec = write_recording(path, events, stop=False)
    try:
        for _ in range(200):  # the writer thread catches up
            if not rec.status()["queued"]:
                break
            time.sleep(0.02)
        snap = tmp_path / "snap.jsonl.gz"
        deadline = time.monotonic() + 20.0
        while True:  # flushed every 50 ms (flush_s=0.2): copy until a copy holds them all
            shutil.copyfile(path, snap)  # what a kill -9 would leave behind
            with RecordingReader(snap) as r:
                back = list(r)
            if len(back) >= len(events) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        rec.stop()
    with RecordingReader(snap) as r:
        back = list(r)
        assert r.summary()["gzip_incomplete"] is True and r.footer is None
    assert back == events


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello world\nthis is text\n", "not an llmtop recording"),
        (b"\x00\x01\x02\xff\xfe binary", "not an llmtop recording"),
        (b'{"type":"request","id":"x"}\n', "not an llmtop recording"),
        (b'{"type":"header","format":"something-else","version":1}\n', "not an llmtop"),
        (b"[1,2,3]\n", "not an llmtop recording"),
        (gzip.compress(b"just text\n"), "not an llmtop recording"),
    ],
)
def test_not_a_recording_is_rejected_clearly(tmp_path: Path, content: bytes,
                                             message: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=message) as ei:
        RecordingReader(path)
    assert "\n" not in str(ei.value)


def test_newer_version_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "v2.jsonl"
    path.write_text('{"type":"header","format":"llmtop-recording","version":2}\n')
    with pytest.raises(RecordingError, match="version 2 is newer"):
        read_header(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="no such file"):
        RecordingReader(tmp_path / "nope.jsonl")
    with pytest.raises(RecordingError, match="is a directory"):
        RecordingReader(tmp_path)


def test_bad_and_unknown_lines_in_the_middle_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    r1, r2 = request(1, T0), request(2, T0 + 1)
    path.write_text(
        '{"type":"header","format":"llmtop-recording","version":1,"started_at":0}\n'
        + json.dumps(r1.to_json_dict()) + "\n"
        + "{broken\n"
        + '{"type":"future_kind","x":1}\n'
        + json.dumps(r2.to_json_dict()) + "\n"
    )
    with RecordingReader(path) as r:
        assert list(r) == [r1, r2]
        assert (r.bad_lines, r.unknown_lines, r.truncated_lines) == (1, 1, 0)


def test_progress_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    write_recording(path, session(300))
    seen: list[tuple[int, int]] = []
    with RecordingReader(path, progress=lambda a, b: seen.append((a, b)),
                         progress_every=4096) as r:
        list(r)
    size = path.stat().st_size
    assert seen and seen[-1] == (size, size)


def test_progress_is_reported_every_mib_by_default(tmp_path: Path) -> None:
    # It used to be every 64 MiB of the file on disk: `llmtop report`/`export` of a
    # .jsonl.gz (5 MB compressed, 25 s to analyse) showed no progress until "100%", and a
    # plain 147 MB one nothing for its first ~10 s. The callback limits itself by time.
    path = tmp_path / "p.jsonl.gz"
    write_recording(path, session(10))
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    body = b"".join(lines[1:-1])
    with gzip.open(path, "wb", compresslevel=0) as fh:  # level 0: over 3 MiB on disk
        fh.write(lines[0])
        while fh.tell() < (3 << 20):
            fh.write(body)
    seen: list[tuple[int, int]] = []
    with RecordingReader(path, progress=lambda a, b: seen.append((a, b))) as r:
        list(r)
    size = path.stat().st_size
    assert seen[-1] == (size, size)
    assert len([done for done, _ in seen if done < size]) >= 2, seen


# -- writer-side errors and the controller -----------------------------------------------


def test_recorder_refuses_to_overwrite_and_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "exists.jsonl"
    path.write_text("keep me")
    with pytest.raises(RecordingError, match="file exists"):
        Recorder(path, header={}).start()
    assert path.read_text() == "keep me"
    with pytest.raises(RecordingError, match="directory does not exist"):
        Recorder(tmp_path / "no" / "dir.jsonl", header={}).start()
    rec = Recorder(path, header={}, overwrite=True)
    rec.start()
    rec.stop()
    assert read_header(path)["format"] == "llmtop-recording"


def test_a_directory_that_takes_no_new_file_is_not_called_missing(tmp_path: Path) -> None:
    """``--record /proc/x.jsonl`` (as root): the directory exists but the open says ENOENT,
    which read "directory does not exist"."""
    def opener(p: Path, overwrite: bool) -> IO[bytes]:
        raise FileNotFoundError(2, "No such file or directory", str(p))

    with pytest.raises(RecordingError) as info:
        Recorder(tmp_path / "x.jsonl", header={}, opener=opener).start()
    assert str(info.value).endswith("x.jsonl: cannot create a file there")


def test_controller_subscribes_and_unsubscribes(tmp_path: Path) -> None:
    bus = EventBus()
    calls = {"n": 0}

    def header() -> dict[str, object]:
        calls["n"] += 1
        return {"upstream": "http://u", "slo": {"ttft_s": 1.0}}

    ctl = RecordingController(bus, header=header, flush_s=0.2)
    assert ctl.status() is None
    with pytest.raises(RecordingError, match="not recording"):
        ctl.stop()
    path = tmp_path / "c.jsonl.gz"
    st = ctl.start(str(path))
    assert st["path"] == str(path) and st["recording"] is True and calls["n"] == 1
    with pytest.raises(RecordingError, match="already recording"):
        ctl.start(str(tmp_path / "other.jsonl"))
    bus.publish(request(1, T0))
    bus.publish(request(2, T0 + 1))
    bus.drain()
    done = ctl.stop()
    assert done["requests"] == 2 and done["recording"] is False and ctl.status() is None
    bus.publish(request(3, T0 + 2))
    bus.drain()  # no longer subscribed: nothing more reaches the closed file
    with RecordingReader(path) as r:
        assert [e.id for e in r if isinstance(e, RequestRecord)] == ["r1", "r2"]
    with pytest.raises(RecordingError, match="file exists"):
        ctl.start(str(path))
    assert ctl.start(str(path), overwrite=True)["recording"] is True
    ctl.stop()


def test_fast_serialisation_equals_to_json_dict() -> None:
    """The writer's event_dict (no deep copies) writes exactly what to_json_dict would."""
    from llmtop.recording.writer import dumps_line, event_dict

    for ev in session(40, duration_s=5):
        assert dumps_line(event_dict(ev)) == dumps_line(ev.to_json_dict())
    full = GpuReading(t=T0, index=1, name="g", mem_used_bytes=1, mem_total_bytes=2,
                      util_gpu=1.0, mem_busy=2.0, dram_bw_util=3.0, power_w=4.0, simulated=True,
                      sm_activity=5.0, power_limit_w=6.0, sm_clock_mhz=7.0, mem_clock_mhz=8.0,
                      temperature_c=9.0, pcie_rx_bytes_s=10.0, pcie_tx_bytes_s=11.0)
    assert dumps_line(event_dict(full)) == dumps_line(full.to_json_dict())


def test_fast_request_decoding_equals_from_json_dict() -> None:
    """The reader's request decoder builds exactly what RequestRecord.from_json_dict does,
    ints in float lists included."""
    from llmtop.recording.reader import _request

    for ev in session(40, duration_s=5):
        if isinstance(ev, RequestRecord):
            d = json.loads(json.dumps(ev.to_json_dict()))
            assert _request(d) == RequestRecord.from_json_dict(d) == ev
    odd = {"id": "x", "user": "u", "model": None, "dialect": "openai", "path": "/", "stream": True,
           "status": 200, "outcome": "ok", "t_start": 1, "ttft_s": None, "e2e_s": 2,
           "prompt_tokens": None, "completion_tokens": None, "token_source": "chunks",
           "chunk_offsets_s": [0, 1], "chunk_tokens": [1, 2], "concurrency_at_start": None}
    assert _request(odd) == RequestRecord.from_json_dict(odd)
    assert _request(odd).chunk_offsets_s == (0.0, 1.0)


def test_progress_lines_on_stderr() -> None:
    import io

    from llmtop.recording.progress import stderr_progress

    out = io.StringIO()
    p = stderr_progress("llmtop report: x", min_interval_s=0.0, stream=out)
    p(64_000_000, 256_000_000)
    p(256_000_000, 256_000_000)
    assert out.getvalue().splitlines() == ["llmtop report: x: 25% (64 MB of 256 MB)",
                                           "llmtop report: x: 100% (256 MB of 256 MB)"]
    quiet = io.StringIO()
    p = stderr_progress("x", min_interval_s=60.0, stream=quiet)
    p(10, 100)
    p(100, 100)  # a read that finished quickly prints nothing
    assert quiet.getvalue() == ""


def test_progress_of_a_file_that_grows_while_read_is_not_a_flood() -> None:
    """A live recording grows while report reads it: every MiB past the size it had when
    opened counted as 'finished' and printed a line at once ('130% (130 MB of 100 MB)', one
    a MiB), past the once-a-second limit."""
    import io
    import time

    from llmtop.recording.progress import stderr_progress

    out = io.StringIO()
    p = stderr_progress("x", min_interval_s=1.0, stream=out)
    time.sleep(1.05)
    p(50_000_000, 100_000_000)
    p(100_000_000, 100_000_000)
    for k in range(1, 51):  # the next 50 MiB, read in well under a second
        p(100_000_000 + k * (1 << 20), 100_000_000)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["x: 50% (50 MB of 100 MB)", "x: 100% (100 MB of 100 MB)"]
    assert len(lines) <= 3, lines
    assert all("%" in ln and int(ln.split(": ")[1].split("%")[0]) <= 100 for ln in lines)
