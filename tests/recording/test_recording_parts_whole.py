"""A rotated recording read whole: ``report``, ``export`` and ``replay`` given the stem
(the path given to ``--record``) read its parts as one recording
(:mod:`llmtop.recording.parts`).

The parts are made by the real :class:`Recorder` with a tiny ``rotate_bytes``, its events
given in batches as the proxy's bus gives them; each part is also read alone, and the
whole must be exactly their union: every request once, the first part's start, the last
part's end, a warning raised in one part and cleared two parts later one episode.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from rec_helpers import request

from llmtop.clock import unix_now
from llmtop.events import RequestRecord, WarningEvent
from llmtop.recording.parts import open_recording, resolve
from llmtop.recording.reader import RecordingReader, iter_recording
from llmtop.recording.replay import ReplayEngine
from llmtop.recording.report.analyse import analyse
from llmtop.recording.writer import Recorder

pytestmark = pytest.mark.timeout(240)

UPSTREAM = "http://127.0.0.1:9/v1"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)


class Run:
    """One recorder run with rotation (a proxy's ``--record STEM`` from start to stop)."""

    def __init__(self, stem: Path, *, rotate_bytes: int = 3000,
                 upstream: str = UPSTREAM) -> None:
        self.rec = Recorder(stem, header={"upstream": upstream, "slo": {"ttft_s": 0.5}},
                            flush_s=0.1, order_hold_s=0.0, rotate_bytes=rotate_bytes)
        self.rec.start()
        self.files: list[Path] = []

    def feed(self, n: int, *, first: int = 0) -> None:
        """``n`` requests, ten at a time, each ten written before the next are given."""
        for i in range(first, first + n, 10):
            now = unix_now()
            self.rec.on_events([request(k, now - 1.0) for k in range(i, min(i + 10, first + n))])
            self.settle()

    def settle(self) -> None:
        deadline = time.monotonic() + 30
        while self.rec.status()["queued"] and time.monotonic() < deadline:
            time.sleep(0.01)

    def warn(self, state: str) -> float:
        t = unix_now()
        self.rec.on_events([WarningEvent(t=t, code="QUEUEING", severity="warning",
                                         message="queueing", state=state)])  # type: ignore[arg-type]
        time.sleep(0.3)  # written before the next requests (flush_s 0.1)
        self.settle()
        return t

    def stop(self) -> list[Path]:
        self.rec.stop()
        return self.parts()

    def parts(self) -> list[Path]:
        """This run's parts in order, found by following ``previous`` from the last."""
        out = [Path(self.rec.status()["path"])]
        while True:
            with RecordingReader(out[0]) as r:
                prev = r.header["previous"]
            if prev is None:
                return out
            out.insert(0, out[0].with_name(prev))


def alone(parts: list[Path]) -> tuple[list[str], list[dict[str, Any]], list[Any]]:
    """Each part read by itself: every request id, the headers, the footers."""
    ids: list[str] = []
    headers, footers = [], []
    for p in parts:
        with RecordingReader(p) as r:
            ids += [e.id for e in r if isinstance(e, RequestRecord)]
            headers.append(r.header)
            footers.append(r.footer)
    return ids, headers, footers


def report_json(*args: str) -> tuple[dict[str, Any], str]:
    p = run_cli("report", *args, "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_the_stem_reads_every_part_once(tmp_path: Path, suffix: str) -> None:
    """report, export (Parquet) and replay given the stem read the union of the parts
    read one by one, each request once; the conditions span the whole series (the first
    part's start, the last part's end, the footer's counts summed)."""
    stem = tmp_path / f"prod{suffix}"
    run = Run(stem, rotate_bytes=3000 if suffix == ".jsonl" else 700)
    run.feed(120)
    parts = run.stop()
    assert len(parts) >= 3, parts
    assert not stem.exists()
    ids, headers, footers = alone(parts)
    assert len(ids) == 120 == len(set(ids))

    report, err = report_json(str(stem))
    c = report["conditions"]
    assert c["requests"] == 120
    assert c["started_at"] == headers[0]["started_at"]
    assert c["ended_at"] == footers[-1]["ended_at"]
    assert c["upstream"] == UPSTREAM
    assert c["extra"]["parts"] == f"1-{len(parts)}"
    first_part = analyse(parts[0])["conditions"]
    assert c["duration_s"] > first_part["duration_s"]
    assert report["source"]["complete"] and report["source"]["events"] == 120
    assert report["source"]["file"] == stem.name
    assert "series" not in err and "missing" not in err, err

    with open_recording(str(stem)) as r:
        assert Counter(e.id for e in r if isinstance(e, RequestRecord)) == Counter(ids)
        assert r.footer is not None and r.footer["requests"] == 120
        assert r.footer["ended_at"] == footers[-1]["ended_at"]
    items = list(iter_recording(stem))
    assert items[0]["started_at"] == headers[0]["started_at"] and items[-1]["requests"] == 120

    out = tmp_path / "pq"
    p = run_cli("export", str(stem), "--parquet", str(out))
    assert p.returncode == 0, p.stderr
    assert Counter(pq.read_table(out / "requests.parquet").column("id").to_pylist()) == \
        Counter(ids)
    hlog = tmp_path / "all.hlog"
    p = run_cli("export", str(stem), "--hlog", str(hlog), "-q")
    assert p.returncode == 0 and hlog.stat().st_size > 0, p.stderr

    seen: list[str] = []
    eng = ReplayEngine(stem, observer=lambda e: seen.extend(
        [e.id] if isinstance(e, RequestRecord) else []))
    eng.run_to_end()
    assert Counter(seen) == Counter(ids)
    assert eng.snapshot(None)["system"]["requests"] == 120
    eng.close()
    p = run_cli("replay", str(stem))  # no terminal: it got as far as the TUI
    assert p.returncode == 2 and "needs a terminal" in p.stderr, p.stderr


def test_progress_counts_the_whole_series(tmp_path: Path) -> None:
    """The progress callback sees the bytes of every part against their sum."""
    run = Run(tmp_path / "p.jsonl")
    run.feed(60)
    parts = run.stop()
    total = sum(p.stat().st_size for p in parts)
    seen: list[tuple[int, int]] = []
    with open_recording(str(tmp_path / "p.jsonl"),
                        progress=lambda a, b: seen.append((a, b))) as r:
        list(r)
    assert seen and {b for _, b in seen} == {total}
    assert seen[-1] == (total, total)
    assert [a for a, _ in seen] == sorted(a for a, _ in seen)


def test_a_warning_across_parts_is_one_episode(tmp_path: Path) -> None:
    """Raised in part 1, carried at the start of the parts after it, cleared in part 3 or
    later: one episode in the report of the whole (from the raise to the clear), one raise
    and one clear read, and replay shows it raised since the first raise in between."""
    stem = tmp_path / "w.jsonl"
    run = Run(stem)
    t_raised = run.warn("raised")
    run.feed(50)
    assert run.rec.part >= 3
    t_cleared = run.warn("cleared")
    run.feed(20, first=50)
    parts = run.stop()
    carried = [p for p in parts[1:] if '"since"' in p.read_text()]
    assert len(carried) >= 2, parts  # the raise is repeated at the start of parts 2, 3, …

    report, _ = report_json(str(stem))
    assert [(w["code"], w["raised_at"], w["cleared_at"]) for w in report["warnings"]] == \
        [("QUEUEING", t_raised, t_cleared)]
    with open_recording(stem) as r:
        warnings = [(e.state, e.t) for e in r if isinstance(e, WarningEvent)]
    assert warnings == [("raised", t_raised), ("cleared", t_cleared)]

    with RecordingReader(carried[0]) as r:
        mid = (float(r.header["started_at"]) + t_cleared) / 2  # in part 2 or after, raised
    eng = ReplayEngine(stem)
    eng.advance_to(mid)
    assert [(w["code"], w["since"]) for w in eng.snapshot(None)["warnings"]] == \
        [("QUEUEING", t_raised)]
    eng.run_to_end()
    assert eng.snapshot(None)["warnings"] == []
    eng.close()


def test_a_part_read_alone_says_when_its_carried_warning_was_raised(tmp_path: Path) -> None:
    """A part after the first begins with the warnings still raised, each with ``since``
    (its first raise). Read alone, the report said it was raised at the part's start and
    measured its duration from there; ``since`` was read by nothing (nor exported). The
    report now says how long before the file it was raised, and measures from then; the
    Parquet warnings table has a ``since`` column."""
    stem = tmp_path / "w.jsonl"
    run = Run(stem)
    t_raised = unix_now() - 30.0  # raised well before any part but the first began
    run.rec.on_events([WarningEvent(t=t_raised, code="QUEUEING", severity="warning",
                                    message="queueing", state="raised")])
    time.sleep(0.3)
    run.settle()
    run.feed(50)
    t_cleared = run.warn("cleared")
    run.feed(20, first=50)
    parts = run.stop()
    carried = [p for p in parts[1:] if '"since"' in p.read_text()]
    assert carried, parts
    last = carried[-1]  # (the part the clear is in, or one before it)
    alone, _ = report_json(str(last))
    (ep,) = alone["warnings"]
    assert ep["since"] == t_raised and ep["raised_at"] > t_raised + 25
    if ep["cleared_at"] is not None:
        assert ep["cleared_at"] == t_cleared
        assert ep["duration_s"] == pytest.approx(t_cleared - t_raised)
    text = run_cli("report", str(last)).stdout
    assert re.search(r"QUEUEING \(warning\): queueing \(raised [0-9.]+ ?s before this file "
                     r"began\)", text), text
    out = tmp_path / "pq"
    assert run_cli("export", str(last), "--parquet", str(out)).returncode == 0
    assert pq.read_table(out / "warnings.parquet").column("since").to_pylist()[0] == t_raised
    whole, _ = report_json(str(stem))  # the whole series: one episode, from the raise
    assert [(w["raised_at"], w["cleared_at"]) for w in whole["warnings"]] == \
        [(t_raised, t_cleared)]


def test_two_series_with_one_stem(tmp_path: Path) -> None:
    """A proxy restarted with the same --record: two series. The newest is read, stderr
    says the other exists and how to pick it; --series 1 reads the first."""
    stem = tmp_path / "r.jsonl.gz"
    first = Run(stem, rotate_bytes=500)
    first.feed(80)
    old = first.stop()
    second = Run(stem, rotate_bytes=500)
    second.feed(60, first=1000)
    new = second.stop()
    assert len(old) >= 2 and len(new) >= 2
    old_ids, _, _ = alone(old)
    new_ids, _, _ = alone(new)

    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == 60
    lines = [x for x in err.splitlines() if "series" in x]
    assert len(lines) == 1 and "2 series" in lines[0] and "--series" in lines[0] \
        and new[0].name in lines[0], err
    report, err = report_json(str(stem), "--series", "1")
    assert report["conditions"]["requests"] == 80
    assert old[0].name in err

    out = tmp_path / "pq"
    p = run_cli("export", str(stem), "--parquet", str(out), "--series", "1")
    assert p.returncode == 0, p.stderr
    assert sorted(pq.read_table(out / "requests.parquet").column("id").to_pylist()) == \
        sorted(old_ids)
    p = run_cli("report", str(stem), "--series", "3")
    assert p.returncode == 2 and "2 series" in p.stderr, p.stderr
    p = run_cli("report", str(old[0]), "--series", "1")  # a part is a file: read alone
    assert p.returncode == 2 and "--series" in p.stderr, p.stderr

    # two stems compared: each read whole
    report, _ = report_json(str(stem), str(stem), "--series", "1")
    assert [r["conditions"]["requests"] for r in report["reports"]] == [80, 80]
    assert set(new_ids).isdisjoint(old_ids)


def test_a_missing_middle_part(tmp_path: Path) -> None:
    """A part deleted (by hand, or by keep): the others are read, stderr names it."""
    stem = tmp_path / "m.jsonl"
    run = Run(stem)
    run.feed(100)
    parts = run.stop()
    assert len(parts) >= 4
    gone = parts.pop(1)
    gone.unlink()
    ids, _, _ = alone(parts)
    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == len(ids) < 100
    said = [x for x in err.splitlines() if "missing" in x]
    assert len(said) == 1 and "part 2 of" in said[0], err
    with open_recording(stem) as r:
        assert Counter(e.id for e in r if isinstance(e, RequestRecord)) == Counter(ids)

    # the parts kept by keep: the first ones gone
    for p in parts[:2]:
        p.unlink()
    src = resolve(stem)
    assert not isinstance(src, str | Path)
    assert src.files == tuple(parts[2:]) and src.missing[0] == range(1, 4)


def test_a_restarted_run_whose_first_parts_keep_deleted(tmp_path: Path) -> None:
    """Series 2's first k parts deleted (``keep``), series 1 ending at part k: series 2's
    part k+1 begins the newest series (its predecessor, part k, is not series 1's part k,
    or the link would hold), and the parts missing from it are 1-k. (Had series 1 ended
    below k, nothing in the files would tell the two runs apart there.)"""
    stem = tmp_path / "k.jsonl"
    first = Run(stem)
    first.feed(30)
    old = first.stop()
    second = Run(stem)
    second.feed(30 + 60, first=1000)
    new = second.stop()
    k = len(old)
    assert k >= 2 and len(new) >= k + 2, (old, new)
    for p in new[:k]:
        p.unlink()
    src = resolve(stem)
    assert not isinstance(src, str | Path)
    assert (src.files, src.missing, src.index, src.count) == (
        tuple(new[k:]), (range(1, k + 1),), 2, 2)
    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == len(alone(new[k:])[0])
    assert f"parts 1-{k} of" in err and "2 series" in err, err


def test_two_runs_are_told_apart_by_their_first_part_whatever_keep_deleted(
        tmp_path: Path) -> None:
    """Series 1 ended at part n, and series 2's first n + 1 parts are gone: by ``previous``
    links alone series 2's part n + 2 joined series 1 (the latest series ending below
    its missing predecessor), one recording of two runs. Each part's header names its
    run's first part (``first``): two series, exactly. Parts written before headers had
    ``first`` are still grouped by their links (the old guess)."""
    stem = tmp_path / "f.jsonl"
    first = Run(stem)
    first.feed(10)
    old = first.stop()
    second = Run(stem)
    second.feed(90, first=1000)
    new = second.stop()
    n = len(old)
    assert len(new) >= n + 3, (old, new)
    for p in new[:n + 1]:
        p.unlink()
    heads = [json.loads(p.read_text().split("\n", 1)[0]) for p in old + new[n + 1:]]
    assert {h["first"] for h in heads[:n]} == {old[0].name}
    assert {h["first"] for h in heads[n:]} == {new[0].name}
    src = resolve(stem)
    assert not isinstance(src, str | Path)
    assert (src.files, src.missing, src.index, src.count) == (
        tuple(new[n + 1:]), (range(1, n + 2),), 2, 2)
    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == len(alone(new[n + 1:])[0])
    assert "first" not in report["conditions"]["extra"], report["conditions"]["extra"]
    assert "2 series" in err and f"parts 1-{n + 1} of" in err, err

    for p in old + new[n + 1:]:  # as written before ``first``: the links' guess
        head, rest = p.read_text().split("\n", 1)
        h = json.loads(head)
        del h["first"]
        p.write_text(json.dumps(h) + "\n" + rest)
    src = resolve(stem)
    assert not isinstance(src, str | Path)
    assert src.files == tuple(old + new[n + 1:]) and src.count == 1


def test_a_crashed_last_part_and_a_part_of_another_upstream(tmp_path: Path) -> None:
    """The last part without its footer (the recorder still running, or killed) and a half
    line at its end: read as a cut-off file is, the whole not complete. A part whose
    header names another upstream: a note says so, the first's is the report's."""
    stem = tmp_path / "c.jsonl"
    run = Run(stem)
    run.feed(60)
    try:
        deadline = time.monotonic() + 30  # flushed (flush_s 0.1); the last part: no footer
        while len(alone(run.parts())[0]) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        parts = run.parts()
        assert len(parts) >= 3
        last = parts[-1]
        text = last.read_bytes().split(b"\n", 1)
        h = json.loads(text[0])
        h["upstream"] = "http://elsewhere:8000/v1"
        last.write_bytes(json.dumps(h).encode() + b"\n" + text[1] + b'{"type":"requ')
        report, err = report_json(str(stem))
        assert not report["source"]["complete"] and report["source"]["truncated_lines"] == 1
        assert report["conditions"]["requests"] == 60
        assert report["conditions"]["upstream"] == UPSTREAM
        assert any("another upstream" in x and last.name in x for x in err.splitlines()), err
    finally:
        run.rec.stop()


def test_a_path_that_is_neither_file_nor_stem(tmp_path: Path) -> None:
    """One line, exit 2, for report, export and replay; a stem whose folder holds only
    other stems' parts is no stem."""
    Run(tmp_path / "other.jsonl").stop()
    for args in (["report", str(tmp_path / "none.jsonl")],
                 ["export", str(tmp_path / "none.jsonl"), "--parquet", str(tmp_path / "o")],
                 ["replay", str(tmp_path / "none.jsonl")],
                 ["report", str(tmp_path / "nodir" / "x.jsonl.gz")]):
        p = run_cli(*args)
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "no such file" in lines[0] and "rotated" in lines[0], \
            (args, p.stderr)
