"""Recordings that rotate (``recording.rotate_mb`` / ``rotate_s`` / ``keep``): a proxy left
recording for weeks writes a series of parts, each a complete recording, instead of one
file that grows until the disk is full.

Every part reads alone (header with ``part`` and ``previous``, footer with its own count);
the parts together hold each request the proxy served exactly once; ``report`` and
``export`` take a part; ``keep`` deletes the stem's oldest parts (an earlier run's
count) and nothing else; a warning
still raised is written again at the start of each part; the admin API names the current
part; ``--workers 2`` rotates the coordinator's one stream; a part that cannot be opened
is reported as any failed write is.
"""

from __future__ import annotations

import asyncio
import calendar
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from disk_support import ROOT, Proxy, Tap, child_env, no_traceback
from rec_helpers import FakeDisk, feed, request, written_late
from test_recording_proxy import traffic

from llmtop.clock import unix_now
from llmtop.config import ConfigError, load_config
from llmtop.events import RequestRecord, WarningEvent
from llmtop.recording.reader import RecordingReader, event_time
from llmtop.recording.writer import Recorder, part_name
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

pytestmark = pytest.mark.timeout(240)


def parts_of(folder: Path, stem: str) -> list[Path]:
    """The parts of stem ``stem`` in ``folder``, in their order (the header's ``part``)."""
    def number(p: Path) -> int:
        with RecordingReader(p) as r:
            return int(r.header["part"])
    return sorted((p for p in folder.iterdir() if p.name.startswith(stem + ".2")), key=number)


def read_part(path: Path) -> tuple[dict[str, Any], list[Any], dict[str, Any] | None]:
    with RecordingReader(path) as r:
        events = list(r)
        assert not r.problems, (path, r.problems)
        return dict(r.header), events, r.footer


def check_chain(parts: list[Path]) -> list[str]:
    """Each part a complete recording, numbered 1, 2, … and naming the one before it; its
    footer counts its own requests; lines in time order. Returns every request id."""
    ids: list[str] = []
    for n, p in enumerate(parts, 1):
        header, events, footer = read_part(p)
        assert header["part"] == n, (p, header)
        assert header["previous"] == (parts[n - 2].name if n > 1 else None), (p, header)
        assert footer is not None, p
        mine = [e.id for e in events if isinstance(e, RequestRecord)]
        assert footer["requests"] == len(mine), (p, footer)
        # and its lines written after a later one of the part (a line later than the hold)
        assert footer["out_of_order"] == written_late([event_time(e) for e in events]), (
            p, footer)
        ids += mine
    return ids


def rotating(path: Path, **kw: Any) -> Recorder:
    rec = Recorder(path, header={"upstream": "http://127.0.0.1:9/v1"}, flush_s=0.1,
                   order_hold_s=0.0, **kw)
    rec.start()
    return rec


# -- through the proxy -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
async def test_parts_through_the_proxy_hold_every_request_once(tmp_path: Path,
                                                               suffix: str) -> None:
    """``POST /recording start`` with ``rotate_mb`` 0.01 (10 kB) in front of the simulator:
    several parts; every part reads alone and counts its own requests; their ids together
    are the proxy's, none twice; ``GET /recording`` names the current part; ``stop`` closes
    it with its footer."""
    stem = tmp_path / f"prod{suffix}"
    async with running_sim("tiny", seed=5) as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "sim", "gpu.interval_s": 0.2, "engine.interval_s": 0.2,
            "recording.flush_s": 0.1, "recording.rotate_mb": 0.01})
        server = LlmtopServer(cfg, out=io.StringIO())
        await server.start()
        try:
            api = server.admin_url + "/llmtop/v1/recording"
            async with aiohttp.ClientSession() as s:
                async with s.post(api, json={"action": "start", "path": str(stem)}) as r:
                    assert r.status == 200, await r.text()
                    first = await r.json()
                assert first["part"] == 1 and first["stem"] == str(stem), first
                assert Path(first["path"]).name.startswith("prod.2") and is_file(first["path"])
                parts_seen = set()
                sent = 0
                for _ in range(40):
                    await traffic(server.proxy_url, 12, 6)
                    sent += 12
                    async with s.get(api) as r:
                        st = (await r.json())["recording"]
                    parts_seen.add(st["path"])
                    assert is_file(st["path"]) and st["error"] is None, st
                    if st["part"] >= 3 and len(parts_seen) >= 2:
                        break
                deadline = time.monotonic() + 20.0
                while time.monotonic() < deadline:  # the last records through the bus
                    await asyncio.sleep(0.2)  # (it hands them to the recorder too)
                    async with s.get(server.admin_url + "/llmtop/v1/requests",
                                     params={"state": "recent", "limit": "500"}) as r:
                        if len(await r.json()) >= min(sent, 500):
                            break
                async with s.post(api, json={"action": "stop"}) as r:
                    assert r.status == 200
                    done = await r.json()
                async with s.get(server.admin_url + "/llmtop/v1/requests",
                                 params={"state": "recent", "limit": "500"}) as r:
                    served = {row["id"] for row in await r.json()}
                assert len(served) < 500, "the admin API keeps the last 500: some not listed"
        finally:
            await server.stop()
    check_parts_served(tmp_path, stem, done, served)


def is_file(path: str) -> bool:
    return Path(path).is_file()


def check_parts_served(folder: Path, stem: Path, done: dict[str, Any], served: set[str]) -> None:
    """The parts after a stop: all there, chained, every request served once; a middle
    part alone through ``report`` and ``export --parquet``."""
    suffix = stem.name[len("prod"):]
    tmp_path = folder
    parts = parts_of(tmp_path, "prod")
    assert len(parts) == done["part"] >= 3, (parts, done)
    assert all(p.name.endswith(suffix) for p in parts)
    assert done["path"] == str(parts[-1]) and not (tmp_path / stem.name).exists()
    ids = check_chain(parts)
    assert len(ids) == len(set(ids)) == done["requests"], "a request lost or written twice"
    assert set(ids) == served
    assert sum(p.stat().st_size for p in parts) == done["bytes"]
    # a part alone: report and export take it
    middle = parts[len(parts) // 2]
    rep = subprocess.run([sys.executable, "-m", "llmtop", "report", str(middle), "--format",
                          "json", "-q"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["source"]["complete"] is True
    assert doc["conditions"]["requests"] == read_part(middle)[2]["requests"]  # type: ignore[index]
    out = tmp_path / "pq"
    exp = subprocess.run([sys.executable, "-m", "llmtop", "export", str(middle), "--parquet",
                          str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert exp.returncode == 0, exp.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(out / "requests.parquet").num_rows == doc["conditions"]["requests"]


# -- the writer alone ----------------------------------------------------------------------


def test_rotate_s_closes_parts_by_time(tmp_path: Path) -> None:
    """``rotate_s``: parts are closed by time alone (a trickle far below any size), each
    complete; no request lost or doubled."""
    rec = rotating(tmp_path / "t.jsonl", rotate_s=0.3)
    for i in range(16):
        feed(rec, 5, first=i * 5)
        time.sleep(0.1)
    st = rec.stop()
    parts = parts_of(tmp_path, "t")
    assert len(parts) == st["part"] >= 2
    ids = check_chain(parts)
    assert sorted(ids) == sorted(f"r{i}" for i in range(80))


def test_a_plain_part_ends_within_one_line_of_rotate_bytes(tmp_path: Path) -> None:
    """300 requests given at once (one writer batch, ~130 kB) with ``rotate_bytes`` 3000:
    each plain part closes at the line that takes it to the limit, the rest going to the
    next part — every part within one line and its footer of 3000 bytes, every request
    once. The size was checked only after a batch of up to 4,096 lines: the first part
    took the whole batch (~44 times the limit)."""
    rec = rotating(tmp_path / "b.jsonl", rotate_bytes=3000)
    now = unix_now()
    rec.on_events([request(k, now - 1.0) for k in range(300)])
    deadline = time.monotonic() + 60
    while rec.status()["queued"] and time.monotonic() < deadline:
        time.sleep(0.01)
    st = rec.stop()
    parts = parts_of(tmp_path, "b")
    assert len(parts) == st["part"] >= 30, st
    for p in parts:
        lines = p.read_bytes().splitlines(keepends=True)
        longest = max(len(x) for x in lines[1:-1]) if len(lines) > 2 else 0
        assert p.stat().st_size <= 3000 + longest + len(lines[-1]), (p, p.stat().st_size)
        # and the part is full up to the limit, not cut short (but the last)
        if p != parts[-1]:
            assert p.stat().st_size - len(lines[-1]) >= 3000, (p, p.stat().st_size)
    assert sorted(check_chain(parts)) == sorted(f"r{i}" for i in range(300))


def test_parts_share_a_second_get_a_suffix(tmp_path: Path) -> None:
    """A part is named for its UTC start to the second; a second part in that second
    gets ``-2`` (and so on)."""
    stem = tmp_path / "prod.jsonl.gz"
    t = calendar.timegm((2026, 12, 6, 14, 0, 0)) + 0.5
    assert part_name(stem, t).name == "prod.20261206T140000Z.jsonl.gz"
    assert part_name(stem, t, 3).name == "prod.20261206T140000Z-3.jsonl.gz"
    assert part_name(tmp_path / "x.jsonl", t).name == "x.20261206T140000Z.jsonl"
    taken = part_name(stem, unix_now())
    taken.write_bytes(b"someone else's")
    rec = Recorder(stem, header={}, rotate_s=3600)
    rec.start()
    rec.stop()
    assert taken.read_bytes() == b"someone else's"  # never overwritten
    made = Path(rec.status()["path"])
    assert made != taken and made.name.startswith("prod.2") and made.exists()


def test_keep_deletes_only_the_recorders_own_oldest_parts(tmp_path: Path) -> None:
    """``keep = 2``: the 2 newest parts remain; a file named like a part of the stem that is
    not one (no part's header) and other files in the folder are not touched."""
    foreign = [tmp_path / "prod.20200101T000000Z.jsonl", tmp_path / "notes.txt",
               tmp_path / "prod.jsonl.bak"]
    for f in foreign:
        f.write_text("not the recorder's\n")
    rec = rotating(tmp_path / "prod.jsonl", rotate_bytes=3000, keep=2)
    feed(rec, 200)
    st = rec.stop()
    assert st["part"] >= 4, st
    for f in foreign:
        assert f.read_text() == "not the recorder's\n"
    left = sorted(set(tmp_path.iterdir()) - set(foreign))
    assert len(left) == 2, left
    numbers = sorted(read_part(p)[0]["part"] for p in left)
    assert numbers == [st["part"] - 1, st["part"]]
    for p in left:
        assert read_part(p)[2] is not None


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_keep_counts_the_parts_an_earlier_run_left(tmp_path: Path, suffix: str) -> None:
    """A proxy restarted with the same stem: ``keep = 3`` holds 3 parts on disk in all —
    the first run's oldest go first, then its newest — not 3 per run; a file named like a
    part that is not one (no part's header) is never counted or deleted."""
    stem = tmp_path / f"prod{suffix}"
    size = 3000 if suffix == ".jsonl" else 400  # (compressed bytes for .gz)
    first = rotating(stem, rotate_bytes=size)  # no keep: every part of run 1 stays
    feed(first, 120)
    first.stop()
    run1 = parts_of(tmp_path, "prod")
    assert len(run1) >= 4, run1
    impostor = part_name(stem, calendar.timegm((2020, 1, 1, 0, 0, 0)))
    impostor.write_text("not a part\n")
    second = rotating(stem, rotate_bytes=size, keep=3)
    # its first part open, run 1's oldest are gone: its 2 newest and this part remain
    assert [p for p in run1 if p.exists()] == run1[-2:]
    assert second.status()["deleted_earlier"] == len(run1) - 2  # (the start line says so)
    feed(second, 120)
    st = second.stop()
    assert st["part"] >= 4, st
    assert st["deleted_earlier"] == len(run1)  # run 1's parts, not run 2's own
    left = [read_part(p)[0] for p in tmp_path.iterdir() if p != impostor]
    assert sorted(h["part"] for h in left) == [st["part"] - 2, st["part"] - 1, st["part"]]
    assert all(h["started_at"] >= st["started_at"] for h in left), (left, st)  # run 2's
    assert impostor.read_text() == "not a part\n"


def test_a_raised_warning_opens_each_next_part(tmp_path: Path) -> None:
    """A warning raised before a boundary is written at the start of the next part (state
    ``raised``, its ``since`` the raise's time), so a part alone knows it; once cleared,
    the parts after it do not carry it."""
    rec = rotating(tmp_path / "w.jsonl", rotate_bytes=3000)
    t0 = unix_now() - 2.0  # (before the first requests: written in part 1, not cut off
    # from it by the size check within a batch)
    rec.on_events([WarningEvent(t=t0, code="QUEUEING", severity="warning", message="q",
                                state="raised")])
    feed(rec, 60)
    raised_until = rec.part
    rec.on_events([WarningEvent(t=unix_now(), code="QUEUEING", severity="warning",
                                message="q", state="cleared")])
    time.sleep(0.3)
    feed(rec, 60, first=60)
    rec.stop()
    parts = parts_of(tmp_path, "w")
    assert raised_until >= 3 and len(parts) > raised_until + 1, (raised_until, len(parts))
    for n, p in enumerate(parts, 1):
        lines = [json.loads(x) for x in p.read_text().splitlines()]
        if 1 < n <= raised_until:
            first = lines[1]
            assert first["type"] == "warning" and first["state"] == "raised", (p, first)
            assert first["code"] == "QUEUEING" and first["since"] == t0
            assert first["t"] == lines[0]["started_at"]
        elif n > raised_until + 1:
            assert not any(x["type"] == "warning" for x in lines), p


class NoRoom(FakeDisk):
    """A disk with no room left: not even the header gets through."""

    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")


def test_no_room_for_the_next_part(tmp_path: Path) -> None:
    """The disk full when the next part opens: the recording stops as on a failed write —
    ``error`` in its status, ``on_error`` told once, what comes later counted as dropped —
    and no empty or half-header part is left; the part before is complete."""
    opened: list[Path] = []

    def opener(path: Path, overwrite: bool) -> FakeDisk:
        if not overwrite and path.exists():  # (as the recorder's own opener: "xb")
            raise FileExistsError(path)
        opened.append(path)
        return FakeDisk(path) if len(opened) == 1 else NoRoom(path)

    told: list[tuple[Path, str]] = []
    rec = Recorder(tmp_path / "d.jsonl", header={}, flush_s=0.1, order_hold_s=0.0,
                   opener=opener, rotate_bytes=3000,
                   on_error=lambda p, e: told.append((p, e)))
    rec.start()
    feed(rec, 20)
    feed(rec, 20, first=20)
    st = rec.stop()
    assert len(opened) == 2 and st["part"] == 1, (opened, st)
    assert st["error"] == f"cannot open the next part: {opened[1]}: cannot write: No space " \
        "left on device", st
    assert told == [(opened[0], st["error"])]
    assert not opened[1].exists()
    assert st["dropped_requests"] > 0
    _, events, footer = read_part(opened[0])
    assert footer is not None and footer["requests"] == sum(
        isinstance(e, RequestRecord) for e in events) == st["requests"]
    assert st["requests"] + st["dropped_requests"] == 40


def test_without_rotation_nothing_changes(tmp_path: Path) -> None:
    """Rotation off: the file at the path given, no ``part`` fields, no status ``part``
    (a guard: it passed before rotation too, as it must)."""
    path = tmp_path / "plain.jsonl"
    rec = rotating(path)
    feed(rec, 30)
    st = rec.stop()
    assert "part" not in st and st["path"] == str(path)
    header, _, footer = read_part(path)
    assert "part" not in header and "previous" not in header
    assert footer is not None and footer["requests"] == 30
    assert sorted(tmp_path.iterdir()) == [path]


def test_a_stem_that_exists_is_no_obstacle(tmp_path: Path) -> None:
    """With rotation the path given is never written (the parts are): ``--record`` naming
    an existing file is refused only without rotation."""
    from llmtop.bus import EventBus
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.writer import RecordingController

    stem = tmp_path / "prod.jsonl"
    stem.write_text("an old recording\n")
    with pytest.raises(RecordingError, match="file exists"):
        RecordingController(EventBus(), header={}).check(str(stem))
    ctl = RecordingController(EventBus(), header={}, rotate_s=3600)
    ctl.check(str(stem))
    st = ctl.start(str(stem))
    ctl.stop()
    assert stem.read_text() == "an old recording\n" and st["path"] != str(stem)
    assert read_part(Path(st["path"]))[2] is not None


# -- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "said"), [
    ({"LLMTOP_RECORDING_ROTATE_MB": "-1"}, "recording.rotate_mb must be 0 (off) or more"),
    ({"LLMTOP_RECORDING_ROTATE_MB": "0.001"}, "recording.rotate_mb must be 0 (off) or at least"),
    ({"LLMTOP_RECORDING_ROTATE_S": "0.2"}, "recording.rotate_s must be 0 (off) or at least 1"),
    ({"LLMTOP_RECORDING_KEEP": "-2", "LLMTOP_RECORDING_ROTATE_S": "60"},
     "recording.keep must be 0 (off) or more"),
    ({"LLMTOP_RECORDING_KEEP": "3"}, "recording.keep needs rotation"),
])
def test_rotation_settings_are_checked(env: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=r"^" + said.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, env=env)


def test_rotation_from_the_environment() -> None:
    cfg = load_config(None, env={"LLMTOP_RECORDING_ROTATE_MB": "500",
                                 "LLMTOP_RECORDING_ROTATE_S": "3600",
                                 "LLMTOP_RECORDING_KEEP": "48"})
    assert (cfg.recording.rotate_mb, cfg.recording.rotate_s, cfg.recording.keep) == (
        500.0, 3600.0, 48)


def test_a_bad_rotation_setting_exits_2_with_one_line(tmp_path: Path) -> None:
    env = child_env(tmp_path)
    env["LLMTOP_RECORDING_ROTATE_MB"] = "-5"
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--record", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
                       check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "rotate_mb" in p.stderr, p.stderr


# -- real processes: --workers 2, a part that cannot be opened -------------------------------


@pytest.mark.parametrize(("extra", "suffix"), [(("--workers", "2"), ".jsonl.gz"),
                                               (("--split-observers",), ".jsonl")])
async def test_workers_2_rotate_one_stream(work: Path, tap: Tap, extra: tuple[str, ...],
                                           suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workers 2 --record`` (and ``--split-observers``) with rotation: the
    coordinator's one stream in parts, each complete, every request the clients got (by
    its user: the tap's id) in exactly one."""
    monkeypatch.setenv("LLMTOP_RECORDING_ROTATE_MB", "0.01")
    stem = work / f"w{suffix}"
    proxy = Proxy(tap.url, stem, work, extra=extra)
    try:
        await proxy.until(lambda s: s["part"] >= 3, tap, max_rounds=120)
        await tap.round(proxy.url)
        await asyncio.sleep(1.0)  # the workers' last records reach the coordinator
    finally:
        code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    parts = parts_of(work, "w")
    assert len(parts) >= 3 and not stem.exists()
    ids = check_chain(parts)
    users = []
    for p in parts:
        users += [e.user for e in read_part(p)[1] if isinstance(e, RequestRecord)]
    assert len(users) == len(set(users)) == len(ids) == tap.checked
    assert set(users) == {f"t{i}" for i in range(1, tap.n + 1)}
    assert any(f"recording {stem} in {len(parts)} parts" in ln for ln in proxy.out), out


async def test_a_next_part_that_cannot_be_opened(work: Path, tap: Tap,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder made read-only while recording: the next part cannot be created. The
    proxy forwards on and says so as for any failed write (stderr at once, the admin
    API's status and ``/health``, the summary); the parts closed before are complete."""
    monkeypatch.setenv("LLMTOP_RECORDING_ROTATE_MB", "0.01")
    sub = work / "rec"
    sub.mkdir()
    proxy = Proxy(tap.url, sub / "r.jsonl", work)
    try:
        await proxy.until(lambda s: s["part"] >= 2, tap, max_rounds=120)
        os.chmod(sub, 0o555)
        st = await proxy.until(lambda s: bool(s["error"]), tap, max_rounds=120)
        assert "cannot open the next part" in st["error"], st
        assert "permission denied" in st["error"], st
        async with aiohttp.ClientSession() as s, s.get(proxy.admin + "/llmtop/v1/health") as r:
            health = await r.json()
        assert health["recording"] is False and "next part" in health["recording_error"]
        before = tap.checked
        await tap.round(proxy.url)
        assert tap.checked == before + 4 and proxy.proc.poll() is None
    finally:
        code = proxy.stop()
        os.chmod(sub, 0o755)
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    warned = [ln for ln in proxy.err if "stopped writing" in ln]
    assert len(warned) == 1 and "cannot open the next part" in warned[0], err
    summary = [ln for ln in proxy.out if ln.startswith("llmtop: recording ")
               and "requests" in ln]
    assert summary and "it stopped writing" in summary[-1], out
    parts = parts_of(sub, "r")
    assert len(parts) == st["part"] >= 2
    check_chain(parts)  # every part there is complete, with its footer
