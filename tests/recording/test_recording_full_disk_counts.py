"""A disk that fills mid-recording takes part of the failing write: the counts say what is
in the file. QA: the summary said "360 requests … (the file may hold fewer)" while the
file held 384 — the failing batch was counted as dropped whole though part of it reached
the disk (and a failed flush counted its lines as written, none of which might have).

A plain file's size says how many whole lines got in: ``requests`` is exact. A ``.gz``
file's compressed bytes do not: ``requests`` is what its last good flush held, and
``unsure_requests`` bounds what more its cut-off stream may hold.
"""

from __future__ import annotations

import time
from pathlib import Path

from rec_helpers import FakeDisk, request

from llmtop.clock import unix_now
from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder


class FillsUp(FakeDisk):
    """A disk with ``room`` bytes left: a write takes what fits, then fails with ENOSPC, as
    ``write(2)`` on a full file system does (a short write, then the error)."""

    def __init__(self, path: Path, room: int) -> None:
        super().__init__(path)
        self.left = room

    def write(self, data: bytes) -> int:
        if len(data) <= self.left:
            self.left -= len(data)
            return super().write(data)
        if self.left:
            super().write(data[:self.left])
            self.flush()
        self.left = 0
        raise OSError(28, "No space left on device")


def recorder(path: Path, room: int) -> Recorder:
    rec = Recorder(path, header={}, flush_s=0.1, order_hold_s=0.0,
                   opener=lambda p, o: FillsUp(p, room))
    rec.start()
    return rec


def give(rec: Recorder, first: int, n: int) -> None:
    """``n`` requests at once (one writer batch), and wait until the writer took them."""
    now = unix_now()
    rec.on_events([request(k, now - 1.0) for k in range(first, first + n)])
    deadline = time.monotonic() + 30
    while rec.status()["queued"] and time.monotonic() < deadline:
        time.sleep(0.01)


def requests_in(path: Path) -> int:
    with RecordingReader(path) as r:
        n = sum(isinstance(e, RequestRecord) for e in r)
        assert r.footer is None  # stopped writing before it
    return n


def test_a_plain_file_counts_the_lines_of_the_failing_write_that_got_in(tmp_path: Path) -> None:
    """Room for ~23 requests after the header, then 200 in one batch: the file holds the
    first ones (and a cut-off line); the status counts exactly those, the rest dropped.
    It said 0 requests (the whole batch dropped) for a file holding 23."""
    path = tmp_path / "full.jsonl"
    rec = recorder(path, 10_000)
    give(rec, 0, 200)
    st = rec.stop()
    assert st["error"] == "write failed: No space left on device", st
    held = requests_in(path)
    assert held > 0 and st["requests"] == held, (held, st)
    assert st["requests"] + st["dropped_requests"] == 200, st
    assert st["counts_settled"] is True and st["unsure_requests"] == 0
    assert st["lines"] == 1 + held  # the header and the requests: whole lines only


def test_a_plain_file_after_good_writes(tmp_path: Path) -> None:
    """Two rounds flushed whole, then the disk fills in the third: the counts are the two
    rounds and what of the third got in."""
    path = tmp_path / "later.jsonl"
    rec = recorder(path, 25_000)
    give(rec, 0, 20)
    give(rec, 20, 20)
    assert rec.status()["error"] is None
    give(rec, 40, 200)
    st = rec.stop()
    held = requests_in(path)
    assert 40 < held < 240 and st["requests"] == held, (held, st)
    assert st["requests"] + st["dropped_requests"] == 240, st


def test_a_plain_file_filling_after_megabytes_in_one_pass(tmp_path: Path) -> None:
    """10,000 requests in one writer pass (~4 MB, three batches) on a disk with room for
    4.2 MB: the writer keeps only the last MB of lines written since its flush (the older
    ones are in the file), and still counts exactly what the file holds."""
    path = tmp_path / "big.jsonl"
    rec = recorder(path, 4_200_000)
    give(rec, 0, 10_000)
    st = rec.stop()
    assert st["error"] == "write failed: No space left on device", st
    held = requests_in(path)
    assert 2 * 4096 < held < 10_000 and st["requests"] == held, (held, st)
    assert st["requests"] + st["dropped_requests"] == 10_000, st


def test_a_gz_file_says_a_bound_that_holds(tmp_path: Path) -> None:
    """``.gz``: its compressed bytes cannot be taken back to lines, so the status says the
    requests its last flush held and how many more may be in its cut-off stream — and the
    file's requests lie between. It counted the failing pass's lines as written (a failed
    flush) or dropped (a failed write), either way a count the file did not hold."""
    path = tmp_path / "full.jsonl.gz"
    rec = recorder(path, 1500)
    give(rec, 0, 20)
    assert rec.status()["error"] is None and rec.status()["requests"] == 20
    for i in range(1, 40):  # until the compressed stream no longer fits
        give(rec, 20 * i, 20)
        if rec.status()["error"]:
            break
    st = rec.stop()
    assert st["error"] is not None and "No space left on device" in st["error"], st
    held = requests_in(path)
    assert st["requests"] <= held <= st["requests"] + st.get("unsure_requests", 0), (held, st)
    assert st["unsure_requests"] > 0 and st["counts_settled"] is True, st
