"""Recording on a real failing disk (QA): ``/dev/full`` (ENOSPC), ``RLIMIT_FSIZE`` (EFBIG;
SIGXFSZ, which CPython ignores), the file deleted, moved or made read-only and its
directory removed while recording, a directory not writable at start; and ``report -o`` /
``export`` writing to such places. Each time the proxy keeps forwarding byte for byte, the
loss is said (stderr at the moment, the admin API's recording status, the summary at
SIGINT), nothing prints a traceback, and what was written before the fault still reads.

Before the fixes here: a recording whose file was deleted or moved went on "recording"
into a file no one could open and said nothing; a failed write was told only in the
summary at exit; ``--record /dev/full`` said "file exists … remove the old file";
``report -o`` and ``export --hlog`` to a device said "wrote" and exited 0 — and renamed a
regular file over the device (as root ``report -o /dev/null`` replaced /dev/null); an
``export --parquet`` past the file size limit printed pyarrow's traceback at exit and left
``.part`` files; ``export --hlog`` said "error: File too large" naming no file.

Every path to a device here goes through a symbolic link in a work directory: a
regression renames over the link, never over /dev's node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from disk_support import (
    ROOT,
    Proxy,
    Tap,
    child_env,
    child_setup,
    llmtop,
    no_traceback,
)
from rec_helpers import session, write_recording

from llmtop.events import RequestRecord
from llmtop.recording.errors import RecordingError
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplayEngine
from llmtop.recording.writer import Recorder

pytestmark = pytest.mark.timeout(240)


def _stopped(proxy: Proxy, why: str) -> None:
    """SIGINT: exit 0 (the proxy served), the summary says the recording stopped and why,
    the moment it stopped was said on stderr, and no traceback anywhere."""
    code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    summary = [ln for ln in proxy.out if ln.startswith("llmtop: recording ") and "requests" in ln]
    assert summary and "it stopped writing" in summary[-1] and why in summary[-1], out
    warned = [ln for ln in proxy.err if "stopped writing" in ln]
    assert len(warned) == 1 and why in warned[0] and "goes on forwarding" in warned[0], err
    no_traceback(out, err)


def _readable(path: Path, work: Path, at_least: int) -> None:
    """What was written before the fault: ``report``, ``export`` and replay read it, with a
    note for its cut-off end, not a crash."""
    rep = llmtop("report", str(path), "--format", "json", "-q", work=work)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["source"]["complete"] is False
    hlog = llmtop("export", str(path), "--hlog", "-", work=work)
    assert hlog.returncode == 0 and "Tag=ttft" in hlog.stdout, hlog.stderr
    assert "no footer" in hlog.stderr or "ends early" in hlog.stderr, hlog.stderr
    no_traceback(rep.stderr, hlog.stderr)
    with RecordingReader(path) as r:
        n = sum(isinstance(e, RequestRecord) for e in r)
        assert r.footer is None  # the recorder stopped writing before its footer
    assert n >= at_least and doc["conditions"]["requests"] == n
    eng = ReplayEngine(path)
    eng.run_to_end()
    assert eng.snapshot(None)["system"]["requests"] == n
    eng.close()


# -- /dev/full ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "r.jsonl", "r.jsonl.gz"])
def test_record_to_dev_full_is_refused_as_not_a_regular_file(work: Path, name: str) -> None:
    """A recording is a new regular file: ``/dev/full`` (or a link to it named like a
    recording) is refused before anything binds, exit 2, one line that says why. It said
    "file exists (a recording is never overwritten); … remove the old file"."""
    target = "/dev/full"
    if name:
        (work / name).symlink_to("/dev/full")
        target = str(work / name)
    p = llmtop("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen",
               "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", target, work=work,
               timeout_s=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "listening" not in p.stdout
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("llmtop run: error: ") and "not a regular file" in line, line
    assert "remove the old file" not in line
    no_traceback(p.stderr)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_recorder_opening_dev_full_fails_at_start_with_enospc(tmp_path: Path,
                                                                suffix: str) -> None:
    """The real device under the recorder (its opener): the header's flush fails, and
    ``start`` says so as a RecordingError — no thread left writing. It raised the OSError
    of closing the file (whose flush failed again) instead: a traceback from ``run``."""
    rec = Recorder(tmp_path / f"r{suffix}", header={},
                   opener=lambda p, o: open("/dev/full", "wb"))  # noqa: SIM115
    with pytest.raises(RecordingError, match="cannot write: No space left on device"):
        rec.start()
    assert not rec.status()["recording"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_no_room_for_the_header_at_start(work: Path, suffix: str) -> None:
    """A file size limit below the header's size (a disk full from the start): ``run``
    exits 2 before it says it listens, one line, and leaves no empty file behind. It
    printed the traceback of an OSError and left the file."""
    path = work / f"r{suffix}"
    (work / "salt").write_text("5a" * 32 + "\n")  # (made, as on any machine used before)
    p = llmtop("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen",
               "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", str(path), work=work,
               fsize=20, timeout_s=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert line == f"llmtop run: error: {path}: cannot write: File too large", line
    assert not path.exists()
    no_traceback(p.stdout, p.stderr)


async def test_admin_start_on_a_full_disk_or_a_device(work: Path, tap: Tap) -> None:
    """``POST /llmtop/v1/recording`` start: no room for the header is a 400 that says so
    and leaves no file (it left the empty file); a link to /dev/full named like a
    recording is a 400 "not a regular file" (it said "file exists … remove the old
    file"). The proxy forwards on, recording nothing."""
    (work / "salt").write_text("5a" * 32 + "\n")
    (work / "dev.jsonl").symlink_to("/dev/full")
    (work / "dir.jsonl").mkdir()  # named as a directory, not "a device, pipe or socket"
    proxy = Proxy(tap.url, None, work, fsize=20)
    try:
        for name, status, why in (("r.jsonl.gz", 400, "cannot write: File too large"),
                                  ("dev.jsonl", 400, "not a regular file"),
                                  ("dir.jsonl", 400, "dir.jsonl: is a directory: a recording "
                                   "is written to a new file; give a file name in it")):
            async with aiohttp.ClientSession() as s, s.post(
                    proxy.admin + "/llmtop/v1/recording",
                    json={"action": "start", "path": str(work / name)}) as r:
                body = await r.json()
            assert r.status == status and why in body["error"], (name, r.status, body)
            assert await proxy.recording() is None
        assert not (work / "r.jsonl.gz").exists()
        assert os.readlink(work / "dev.jsonl") == "/dev/full"
        await tap.round(proxy.url)
    finally:
        code = proxy.stop()
    assert code == 0
    no_traceback("\n".join(proxy.out), "\n".join(proxy.err))


def test_the_pseudonym_salt_on_a_full_disk(work: Path) -> None:
    """The first start on a machine makes the API-key pseudonym salt file: when it cannot be
    written, a random salt for this process (as for a read-only home), no file left — not
    the OSError's traceback out of ``llmtop run`` and an empty salt file that read as
    damaged (so a random salt per process) ever after."""
    code = ("from llmtop.proxy.identity import stored_salt; "
            "print(stored_salt())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env(work), cwd=ROOT, preexec_fn=child_setup(20), timeout=60,
                       check=False)
    assert p.returncode == 0 and p.stdout.strip() == "None", (p.stdout, p.stderr)
    assert not (work / "salt").exists()
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=child_env(work), cwd=ROOT, timeout=60, check=False)
    assert again.returncode == 0 and len(again.stdout.strip()) > 32, again.stderr
    assert (work / "salt").exists()


# -- RLIMIT_FSIZE mid-recording ------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "fsize"), [(".jsonl", 6000), (".jsonl.gz", 2500)])
async def test_file_size_limit_mid_recording(work: Path, tap: Tap, suffix: str,
                                             fsize: int) -> None:
    """Writes past ``RLIMIT_FSIZE`` fail with EFBIG and raise SIGXFSZ: the proxy is not
    killed (CPython ignores SIGXFSZ), forwards on byte for byte, says at once on stderr that
    the recording stopped, and the admin API's status and the summary say why; what reached
    the file reads (its cut-off line or gzip stream noted)."""
    path = work / f"r{suffix}"
    proxy = Proxy(tap.url, path, work, fsize=fsize)
    try:
        st = await proxy.until(lambda s: bool(s["error"]), tap)
        assert "File too large" in st["error"] and st["recording"], st
        before = tap.checked
        await tap.round(proxy.url)  # forwarding goes on
        assert tap.checked == before + 4 and proxy.proc.poll() is None
        await proxy.until(lambda s: s["dropped"] > 0, tap, max_rounds=20)
    finally:
        _stopped(proxy, "File too large")
    assert path.stat().st_size <= fsize
    _readable(path, work, at_least=1)
    # the summary's count is the file's (a plain file), or a bound that holds (.gz): it
    # counted the failing write's lines as dropped, or a failed flush's as written
    with RecordingReader(path) as r:
        held = sum(isinstance(e, RequestRecord) for e in r)
    (said,) = [ln for ln in proxy.out if ln.startswith(f"llmtop: recording {path}: ")]
    m = re.search(r": (?:at least )?(\d+) requests(?:, up to (\d+) more in the file's "
                  r"last lines)?", said)
    assert m is not None, said
    n, more = int(m[1]), int(m[2] or 0)
    if suffix == ".jsonl":
        assert n == held and not more, (held, said)
    else:
        assert n <= held <= n + more, (held, said)
    assert "may hold fewer" not in said, said


# -- the file or its directory taken away ----------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "moved", "directory removed"])
async def test_file_gone_while_recording(work: Path, tap: Tap, how: str) -> None:
    """The recording's file deleted, moved, or its directory removed: the writes would
    succeed into a file no one opens by that name (a deleted one is gone at close) while
    the status counted them recorded. Now the recorder stops and says so; the proxy
    forwards on. A moved file holds what was written before, and reads."""
    sub = work / "rec"
    sub.mkdir()
    path = sub / "r.jsonl"
    proxy = Proxy(tap.url, path, work)
    try:
        await proxy.until(lambda s: s["requests"] >= 4, tap)
        moved = work / "moved.jsonl"
        if how == "deleted":
            path.unlink()
        elif how == "moved":
            path.rename(moved)
        else:
            shutil.rmtree(sub)
        st = await proxy.until(lambda s: bool(s["error"]), tap, max_rounds=20)
        assert "no longer at its path" in st["error"], st
        async with aiohttp.ClientSession() as s, s.get(proxy.admin + "/llmtop/v1/health") as r:
            health = await r.json()
        assert health["recording"] is False, health  # (it said true until stopped by hand)
        assert "no longer at its path" in health["recording_error"], health
        again = {"action": "start", "path": str(work / "again.jsonl")}
        async with aiohttp.ClientSession() as s, s.post(
                proxy.admin + "/llmtop/v1/recording", json=again) as r:
            assert r.status == 409
            assert "stopped writing (the file is no longer" in (await r.json())["error"]
        await tap.round(proxy.url)
        assert proxy.proc.poll() is None
    finally:
        _stopped(proxy, "no longer at its path")
    assert not path.exists()
    if how == "moved":
        _readable(moved, work, at_least=4)


async def test_file_deleted_under_workers(work: Path, tap: Tap) -> None:
    """``--workers 2``: the coordinator's recorder notices and says so the same way (its
    Observers are the single process's)."""
    path = work / "w.jsonl.gz"
    proxy = Proxy(tap.url, path, work, extra=("--workers", "2"))
    try:
        await proxy.until(lambda s: s["requests"] >= 4, tap)
        path.unlink()
        st = await proxy.until(lambda s: bool(s["error"]), tap, max_rounds=20)
        assert "no longer at its path" in st["error"], st
        await tap.round(proxy.url)
        assert proxy.proc.poll() is None
    finally:
        _stopped(proxy, "no longer at its path")


async def test_file_made_read_only_while_recording(work: Path, tap: Tap) -> None:
    """chmod a-w on the file (and its directory) mid-recording: the recorder's descriptor
    was opened for writing, so writing goes on, the footer included — nothing lost, nothing
    to say. Coverage: it already behaved."""
    path = work / "r.jsonl.gz"
    proxy = Proxy(tap.url, path, work)
    try:
        await proxy.until(lambda s: s["requests"] >= 4, tap)
        os.chmod(path, 0o444)
        os.chmod(work, 0o555)
        await tap.round(proxy.url)
        await tap.round(proxy.url)
    finally:
        code = proxy.stop()
        os.chmod(work, 0o755)
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    assert "stopped writing" not in out + err
    with RecordingReader(path) as r:
        n = sum(isinstance(e, RequestRecord) for e in r)
        assert r.footer is not None and r.footer["requests"] == n
    assert n == tap.checked
    assert f"recording {path}: {n} requests" in out


def test_directory_not_writable_at_start(work: Path) -> None:
    """``--record`` into a directory the user may not write: exit 2 before anything binds,
    one line. (Under root the child loses CAP_DAC_OVERRIDE: disk_support.) Coverage."""
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    p = llmtop("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen",
               "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record", str(ro / "r.jsonl"),
               work=work, timeout_s=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "listening" not in p.stdout
    (line,) = p.stderr.strip().splitlines()
    assert line == f"llmtop run: error: {ro / 'r.jsonl'}: permission denied", line
    assert not (ro / "r.jsonl").exists()


# -- report -o and export to a failing output ---------------------------------------------------


@pytest.fixture
def recording(work: Path) -> Path:
    path = work / "in.jsonl"
    write_recording(path, session(200, duration_s=30))
    path.chmod(0o644)
    return path


def _failed_output(p: subprocess.CompletedProcess[str], out: Path, why: str) -> None:
    # the disk failed, not the user: a runtime failure, exit 1 (interfaces.md); a path that
    # cannot be written at all (no such directory, permission denied) stays exit 2
    assert p.returncode == 1, (p.stdout, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert errors == [ln for ln in p.stderr.splitlines() if not ln.startswith(
        ("llmtop export: note", "llmtop report: note"))], p.stderr
    (line,) = errors
    assert f"{out}: cannot write: {why}" in line, line
    assert "wrote" not in p.stdout + p.stderr
    no_traceback(p.stderr)


@pytest.mark.parametrize("args", [["report", "--format", "text", "-o"],
                                  ["report", "--format", "json", "-o"],
                                  ["export", "--hlog"]])
def test_output_to_dev_full_is_an_error(work: Path, recording: Path, args: list[str]) -> None:
    """``-o``/``--hlog`` naming /dev/full (through a link): one error line, exit 1 — and
    the link still names the device. Before: "wrote", exit 0, and the finished ``.part``
    renamed over the link (over /dev/full itself, for root)."""
    out = work / "full.out"
    out.symlink_to("/dev/full")
    cmd, *flags = args
    p = llmtop(cmd, str(recording), *flags, str(out), work=work)
    _failed_output(p, out, "No space left on device")
    assert out.is_symlink() and os.readlink(out) == "/dev/full"
    assert not list(work.glob(".*.part"))


def test_report_to_a_device_is_written_in_place(work: Path, recording: Path) -> None:
    """``-o`` a link to /dev/stdout: the report goes to standard output; the link is left."""
    out = work / "stdout.txt"
    out.symlink_to("/dev/stdout")
    p = llmtop("report", str(recording), "-o", str(out), work=work)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("llmtop report — in.jsonl")
    assert out.is_symlink()


@pytest.mark.parametrize("args", [["report", "-o", "out.txt"],
                                  ["report", "--format", "json", "-o", "out.json"],
                                  ["export", "--hlog", "out.hlog", "--interval", "1"],
                                  ["export", "--parquet", "pq"]])
def test_output_past_the_file_size_limit(work: Path, recording: Path, args: list[str]) -> None:
    """``RLIMIT_FSIZE`` below the output's size: one line naming the output and EFBIG,
    exit 1, nothing left — no output, no ``.part`` (a half file is never presented as
    good), no traceback (pyarrow's writer printed one at exit for ``--parquet``)."""
    cmd, *rest = args
    out = work / rest[-1] if cmd == "report" else work / rest[1]
    rest = [str(work / a) if a == out.name else a for a in rest]
    p = llmtop(cmd, str(recording), *rest, work=work, fsize=700)
    # (--parquet: the table that failed, the first to pass 700 bytes)
    _failed_output(p, out / "requests.parquet" if cmd == "export" and "--parquet" in rest
                   else out, "File too large")
    assert not out.exists()
    leftovers = sorted(str(q.relative_to(work)) for q in work.rglob("*")
                       if q.name not in ("in.jsonl", "salt"))
    assert leftovers == [], leftovers
