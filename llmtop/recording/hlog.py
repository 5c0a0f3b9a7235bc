"""A recording as HdrHistogram interval logs (the ``.hlog`` format of HdrHistogram's
``HistogramLogWriter``, log format version 1.2).

One interval every ``interval_s`` seconds of the session, by when requests *finished* (the
moment the live aggregator counts them), one tagged line per metric that has values:
``ttft``, ``itl``, ``chunk_gap``, ``tpot``, ``e2e``. Histogram values are microseconds, as
everywhere in llmtop. ``Interval_Max`` is, as HdrHistogram's log writers do it, the interval's
maximum divided by a ``maxValueUnitRatio`` so that it reads in milliseconds (their default
ratio of 10^6 assumes nanosecond values; ours is 1000 for microseconds); the first comment
line of the log says so. Timestamps are seconds relative to the ``BaseTime`` line, which is
the recording's start.

The histograms are built by the live aggregator's own code (:func:`llmtop.metrics.ingest.ingest`
and the encoding of :mod:`llmtop.metrics.hdr`), so each interval holds exactly the samples the
live snapshots counted, encoded as they are in ``/llmtop/v1/snapshot``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
from pathlib import Path
from typing import IO, Any, Final

from llmtop.events import RequestRecord
from llmtop.metrics.hdr import HIGHEST_EQ, encode_sparse
from llmtop.metrics.ingest import COUNTERS, METRICS, ingest
from llmtop.metrics.slo import Slo
from llmtop.recording.errors import RecordingError
from llmtop.recording.parts import Source, open_recording, source_path
from llmtop.recording.paths import is_special, part_path
from llmtop.recording.reader import Progress

TAGS: Final = ("ttft", "itl", "chunk_gap", "tpot", "e2e")
LOG_FORMAT_VERSION: Final = "1.2"
MAX_VALUE_UNIT_RATIO: Final = 1000.0  # µs → ms in the Interval_Max column
MIN_INTERVAL_S: Final = 0.001
"""The log's timestamps and lengths have millisecond resolution: a shorter interval would
be written as length 0.000 and intervals with one StartTimestamp."""
_NO_SLO: Final = Slo()


class _Interval:
    """The records that finished in one interval; histograms built when it is written."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def add(self, r: RequestRecord) -> None:
        self.records.append(r)

    def histograms(self) -> dict[str, tuple[Any, Any]]:
        """Per tag, the system histogram ``(hdr indices, counts)`` — through the live
        aggregator's own ingest (same samples, same rules: TPOT and E2E only from ok
        requests)."""
        n = len(self.records)
        # series 0 is the system; user and model samples go to series 1 (ignored here)
        b = ingest(self.records, [1] * n, [1] * n, [0] * n, _NO_SLO, (2, len(COUNTERS)))
        return {tag: b.table.group_slice(METRICS.index(tag), 0) for tag in TAGS}


class _LogWriter:
    def __init__(self, fh: IO[str], base: float, interval_s: float, name: str) -> None:
        self.fh = fh
        self.base = base
        self.interval_s = interval_s
        self.counts = dict.fromkeys(TAGS, 0)
        when = dt.datetime.fromtimestamp(base, dt.UTC).strftime("%a %b %d %H:%M:%S UTC %Y")
        fh.write(f"#[llmtop recording {name}: histogram values are latencies in microseconds; "
                 "Interval_Max is in milliseconds (the maximum / 1000, HdrHistogram's "
                 f"maxValueUnitRatio); one interval per {interval_s:g} s]\n")
        fh.write(f"#[Histogram log format version {LOG_FORMAT_VERSION}]\n")
        fh.write(f"#[StartTime: {base:.3f} (seconds since epoch), {when}]\n")
        fh.write(f"#[BaseTime: {base:.3f} (seconds since epoch)]\n")
        fh.write('"StartTimestamp","Interval_Length","Interval_Max",'
                 '"Interval_Compressed_Histogram"\n')

    def write(self, k: int, iv: _Interval) -> None:
        start = k * self.interval_s
        for tag, (idx, counts) in iv.histograms().items():
            if len(idx) == 0:
                continue
            max_us = int(HIGHEST_EQ[idx[-1]])
            self.fh.write(f"Tag={tag},{start:.3f},{self.interval_s:.3f},"
                          f"{max_us / MAX_VALUE_UNIT_RATIO:.3f},{encode_sparse(idx, counts)}\n")
            self.counts[tag] += 1


def export_hlog(
    recording: Source,
    out_file: str | Path,
    *,
    interval_s: float = 10.0,
    progress: Progress | None = None,
    summary: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Write the interval log; returns how many intervals were written per tag. ``out_file``
    ``-`` is standard output (written as it goes; a file is written under a temporary name
    and renamed at the end). ``summary``, when given, is filled with the reader's
    :meth:`~RecordingReader.summary` (lines skipped, footer or not)."""
    if not interval_s >= MIN_INTERVAL_S:
        raise ValueError(f"interval_s must be at least {MIN_INTERVAL_S}")
    to_stdout = str(out_file) == "-"
    out = Path(out_file)
    # a device or FIFO (/dev/stdout, /dev/full) is written in place: a rename over it would
    # replace it with a regular file (paths.is_special)
    tmp = out if is_special(out) else part_path(out)
    if not to_stdout:
        if out.is_dir():
            raise RecordingError(f"{out}: is a directory; give a file name for the log")
        if not out.parent.is_dir():
            raise RecordingError(f"{out}: cannot write: no directory {out.parent}")
    with open_recording(recording, progress=progress) as reader:
        try:
            fh: IO[str] = (sys.stdout if to_stdout
                           else open(tmp, "w", encoding="ascii"))  # noqa: SIM115 - closed below
        except OSError as exc:
            raise RecordingError(f"{out}: cannot write: {exc.strerror}") from None
        try:
            writer: _LogWriter | None = None
            open_iv: dict[int, _Interval] = {}
            for ev in reader:
                if not isinstance(ev, RequestRecord):
                    continue
                t_end = ev.t_start + ev.e2e_s
                if writer is None:
                    # (read now, not before the first event: a start the reader finds
                    # wrong, days after the events, is None by then)
                    base = reader.header.get("started_at")
                    if not isinstance(base, int | float):
                        base = ev.t_start
                    writer = _LogWriter(fh, float(base), interval_s, source_path(recording).name)
                k = max(0, int((t_end - writer.base) // interval_s))
                if open_iv and k < min(open_iv):
                    k = min(open_iv)  # late by more than an interval: the oldest open one
                iv = open_iv.get(k)
                if iv is None:
                    iv = open_iv[k] = _Interval()
                    # requests arrive in finish order, give or take a bus batch: keep the
                    # previous interval open for stragglers, write the older ones
                    for old in sorted(j for j in open_iv if j < k - 1):
                        writer.write(old, open_iv.pop(old))
                iv.add(ev)
            if writer is None:
                base = reader.header.get("started_at")
                start = base if isinstance(base, int | float) else 0.0
                writer = _LogWriter(fh, float(start), interval_s, source_path(recording).name)
            for k in sorted(open_iv):
                writer.write(k, open_iv[k])
            if to_stdout:
                fh.flush()
            else:
                fh.close()
                if tmp != out:
                    os.replace(tmp, out)
        except BaseException:
            if not to_stdout:
                with contextlib.suppress(OSError):  # (the write that failed, again)
                    fh.close()
                if tmp != out:
                    tmp.unlink(missing_ok=True)
            raise
        if summary is not None:
            summary.update(reader.summary())
    return writer.counts
