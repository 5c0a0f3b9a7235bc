"""Two recorders on one stem (a restart that overlaps the old process; two proxies given
one ``--record``): each locks the part it is writing (:mod:`llmtop.recording.partlock`),
and the other's ``keep`` leaves that part — it deleted it before, and the first recorder
then stopped ("the file is no longer at its path"). The second starts all the same, with a
warning on stderr naming the other's part; a lock held by a process killed with ``-9`` is
gone with it and blocks nothing.

Real recorders on real files; the proxies are real ``llmtop run --headless`` processes
(plain, ``--workers 2`` with ``.jsonl.gz``, ``--split-observers``) in front of the
simulator through the byte-exact tap.
"""

from __future__ import annotations

import asyncio
import fcntl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from disk_support import Proxy, Tap, no_traceback
from rec_helpers import feed
from test_recording_rotation import parts_of, read_part, rotating

from llmtop.events import RequestRecord
from llmtop.recording.partlock import held_elsewhere, lock_part
from llmtop.recording.writer import Recorder

pytestmark = pytest.mark.timeout(300)


def check_readable(parts: list[Path]) -> list[str]:
    """Every part left reads whole (no problem, a footer counting its own requests);
    every request id, none twice. Returns them."""
    ids: list[str] = []
    for p in parts:
        _header, events, footer = read_part(p)
        assert footer is not None, p
        mine = [e.id for e in events if isinstance(e, RequestRecord)]
        assert footer["requests"] == len(mine), (p, footer)
        ids += mine
    assert len(ids) == len(set(ids)), "a request written twice"
    return ids


def settled(rec: Recorder) -> Path:
    """The part ``rec`` writes once a part due to close is closed (fed, the writer closes
    a part that reached ``rotate_bytes`` in the pass that wrote the last lines, after
    ``feed`` saw the queue empty; the next is below it, as it holds only its header)."""
    deadline = time.monotonic() + 30
    while rec.part_path.stat().st_size >= rec.rotate_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return rec.part_path


def is_part(path: Path, header: dict[str, Any]) -> bool:
    """Whether the part with this header is at ``path`` (its name may be another's now:
    these parts start many a second, and a name freed by keep is taken again)."""
    return path.exists() and read_part(path)[0] == header


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_keep_leaves_the_part_another_recorder_is_writing(tmp_path: Path, suffix: str) -> None:
    """A recorder writing a stem, and a second one started on it with ``keep = 1``: the
    second deletes the first's finished parts but not the one it is writing, and says so
    (``others_writing``, ``left_held``); the first goes on writing without an error. Once
    the first has closed that part, the second's next part deletes it."""
    stem = tmp_path / f"prod{suffix}"
    size = 3000 if suffix == ".jsonl" else 400  # (compressed bytes for .gz)
    first = rotating(stem, rotate_bytes=size)
    feed(first, 120)
    writing = settled(first)
    before = parts_of(tmp_path, "prod")
    assert len(before) >= 3, before
    assert writing == before[-1]
    header = read_part(writing)[0]
    second = rotating(stem, rotate_bytes=size, keep=1)
    try:
        assert is_part(writing, header), "keep deleted the part another recorder is writing"
        assert not any(p.exists() for p in before[:-1])  # the finished ones: deleted
        st = second.status()
        assert st["others_writing"] == [str(writing)], st
        assert st["left_held"] == st["left_held_at_start"] == 1, st
        assert st["deleted_earlier"] == len(before) - 1, st
        feed(first, 60, first=1000)  # the first goes on, through its next parts
        assert first.status()["error"] is None, first.status()
        assert first.part_path != writing  # (it closed that part and opened others)
        in_writing = {e.id for e in read_part(writing)[1] if isinstance(e, RequestRecord)}
        feed(second, 60, first=2000)  # the second's next parts: that part is free now
        assert not is_part(writing, header)
    finally:
        done_first = first.stop()
        done_second = second.stop()
    assert done_first["error"] is None and done_second["error"] is None
    assert done_second["left_held"] == 1
    ids = set(check_readable(parts_of(tmp_path, "prod")))
    # what keep did not delete is there: the first's requests since the second started
    # (but those of the part left, deleted once free), and the second's newest part
    assert {f"r{i}" for i in range(1000, 1060)} - in_writing <= ids
    assert not in_writing & ids
    assert Path(done_second["path"]).exists() and Path(done_first["path"]).exists()


async def _lines(lines: list[str], pick: Callable[[str], bool]) -> list[str]:
    """The lines of a child's output that ``pick`` takes, once there is one (up to 30 s):
    the admin API can answer before the thread reading the child's pipe has read the
    start lines printed just before, on a busy machine."""
    for _ in range(300):
        if got := [ln for ln in lines if pick(ln)]:
            return got
        await asyncio.sleep(0.1)
    return []


def _exit_line(proxy: Proxy, stem: Path) -> str:
    said = [ln for ln in proxy.out if ln.startswith(f"llmtop: recording {stem} in ")]
    assert len(said) == 1, proxy.out
    return said[0]


@pytest.mark.parametrize(("extra", "suffix"), [((), ".jsonl"),
                                               (("--workers", "2"), ".jsonl.gz"),
                                               (("--split-observers",), ".jsonl")])
async def test_two_proxies_on_one_stem(work: Path, tap: Tap, extra: tuple[str, ...],
                                       suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Proxy A recording with ``--rotate-mb 0.01 --keep 2`` (and ``--workers 2`` or
    ``--split-observers``), then proxy B with the same ``--record`` and ``--keep 1``
    while A runs (with B's first part, A's current part is past keep at once): B's keep
    deletes A's finished parts (they count as an earlier run's) but leaves the one A is
    writing; B warns on stderr naming it, its start line and exit line say it left it.
    A records on without an error; every part either left is complete, every request in
    it once.
    """
    monkeypatch.setenv("LLMTOP_ENGINE_ENABLED", "false")  # (parts grow by traffic only)
    stem = work / f"same{suffix}"
    flags = ("--rotate-mb", "0.01", "--keep")
    a = Proxy(tap.url, stem, work, extra=(*flags, "2", *extra))
    b: Proxy | None = None
    try:
        st_a = await a.until(lambda s: s["part"] >= 3, tap, max_rounds=160)
        writing = Path(st_a["path"])
        header = read_part(writing)[0]
        b = Proxy(tap.url, stem, work, extra=(*flags, "1"))
        for _ in range(300):  # (the recording starts just after the proxy listens)
            st_b = await b.recording()
            if st_b is not None:
                break
            await asyncio.sleep(0.1)
        assert st_b is not None
        assert is_part(writing, header), "B's keep deleted the part A is writing"
        assert st_b["others_writing"] == [str(writing)], st_b
        assert st_b["left_held_at_start"] == 1, st_b
        started = await _lines(b.out, lambda ln: ln.startswith(f"llmtop: recording to {stem} in "
                                                              "parts"))
        assert len(started) == 1 and "left 1 part another live process is writing" \
            in started[0], b.out
        warned = await _lines(b.err, lambda ln: "another live process is recording to" in ln)
        assert len(warned) == 1 and str(writing) in warned[0], b.err
        # both go on: A through its next parts (the one B left is then free), B through its
        await a.until(lambda s: s["part"] >= st_a["part"] + 2, tap, max_rounds=160)
        await b.until(lambda s: s["part"] >= 2, tap, max_rounds=160)
        st_a = await a.recording()
        assert st_a is not None and st_a["error"] is None, st_a
        await asyncio.sleep(1.0)  # (the workers' last records reach the coordinator)
    finally:
        code_b = b.stop() if b is not None else 0
        code_a = a.stop()
    assert (code_a, code_b) == (0, 0), (a.out, a.err, b.out if b else None)
    no_traceback("\n".join(a.out), "\n".join(a.err))
    assert b is not None
    no_traceback("\n".join(b.out), "\n".join(b.err))
    assert not any("stopped writing" in ln for ln in [*a.out, *a.err]), (a.out, a.err)
    assert "stopped writing" not in _exit_line(a, stem)
    assert "left 1 part another live process was writing" in _exit_line(b, stem)
    left = parts_of(work, "same")
    assert len(left) >= 3, left  # A's 2 newest, B's newest
    users = [e.user for p in left for e in read_part(p)[1] if isinstance(e, RequestRecord)]
    assert len(check_readable(left)) == len(users) == len(set(users))
    assert set(users) <= {f"t{i}" for i in range(1, tap.n + 1)}


async def test_a_killed_recorders_lock_blocks_nothing(work: Path, tap: Tap) -> None:
    """A proxy killed with ``-9`` mid-part (its lock gone with it), and a live recorder
    on the same stem: a proxy started there with ``--keep 1`` deletes the dead one's
    parts, its last unfinished one included, and leaves only the live one's part — the
    warning names that one, not the dead one's."""
    stem = work / "dead.jsonl"
    d = Proxy(tap.url, stem, work, extra=("--rotate-mb", "0.01"))
    try:
        st_d = await d.until(lambda s: s["part"] >= 2, tap, max_rounds=160)
    finally:
        d.proc.kill()
        d.proc.wait()
        d.stop()
    dead = parts_of(work, "dead")
    assert Path(st_d["path"]) in dead and len(dead) >= 2
    live = rotating(stem, rotate_bytes=10**6)  # (one part, open throughout)
    b: Proxy | None = None
    try:
        feed(live, 10)
        writing = settled(live)
        b = Proxy(tap.url, stem, work, extra=("--rotate-mb", "0.01", "--keep", "1"))
        for _ in range(300):
            st_b = await b.recording()
            if st_b is not None:
                break
            await asyncio.sleep(0.1)
        assert st_b is not None
        assert not any(p.exists() for p in dead), "a dead process's part was kept"
        assert writing.exists(), "keep deleted the part a live recorder is writing"
        assert st_b["others_writing"] == [str(writing)], st_b
        warned = await _lines(b.err, lambda ln: "another live process is recording to" in ln)
        assert len(warned) == 1 and str(writing) in warned[0], b.err
        assert not any(str(p) in warned[0] for p in dead)
        feed(live, 10, first=100)
        assert live.status()["error"] is None, live.status()
    finally:
        if b is not None:
            assert b.stop() == 0, (b.out, b.err)
        done = live.stop()
    assert done["error"] is None
    check_readable([Path(done["path"])])


def test_a_part_is_locked_though_another_recorder_looks_at_it_as_it_is_made(
        tmp_path: Path) -> None:
    """Another recorder starting looks at the files named like parts (a shared lock for a
    moment): a part made in that moment still gets its lock (tried again), and one whose
    look never ends is written unlocked rather than waited on."""
    part = tmp_path / "p.20261206T140000Z.jsonl"
    with open(part, "xb") as fh:
        with open(part, "rb") as look:
            fcntl.flock(look.fileno(), fcntl.LOCK_SH)
            threading.Timer(0.001, look.close).start()  # (the look ends: its lock with it)
            assert lock_part(fh.fileno())
        assert held_elsewhere(part) is True
    assert held_elsewhere(part) is False  # (closed: the lock is gone)
    other = tmp_path / "p.20261206T140001Z.jsonl"
    with open(other, "xb") as fh, open(other, "rb") as look:
        fcntl.flock(look.fileno(), fcntl.LOCK_SH)
        assert not lock_part(fh.fileno())
