"""The recorder: a bus subscriber that writes the JSON Lines recording off the forwarding path.

``Recorder.on_events`` runs on the event loop (it is an :class:`llmtop.bus.EventBus`
subscriber). It only appends the event *objects* to a bounded queue — O(batch), no JSON, no
I/O, never a lock that the writer holds while writing — and when the queue is full it counts
the events it could not keep (``dropped``) instead of stalling the proxy. The queue is bounded
by events (``queue_max``) and by the request records' chunks (``queue_max_chunks``): on a
stalled disk 100,000 queued 16k-token answers would otherwise hold tens of GB. A writer thread
serialises (the events' ``to_json_dict`` shape, built without deep copies, + ``json.dumps``),
writes and flushes.

Durability: every ``flush_s / 8`` (:data:`PASSES_PER_FLUSH`) the writer thread writes what
is queued and hands it to the operating system (``flush()``; for ``.jsonl.gz`` a
``Z_SYNC_FLUSH`` so the compressed stream read so far decodes). That is what survives
``kill -9`` of the process: the OS page cache belongs to the kernel, so every line queued
more than ``flush_s`` before the kill is in the file. ``os.fsync`` (surviving a power cut)
is done once, when the recording is stopped — an fsync per flush would cost a disk round
trip several times a second for no gain against a killed process.

A write or flush that fails (a full disk) takes part of what it was given: the counts are
then settled against the file (``Recorder._settle``): exact for a plain file (its size
says how many whole lines got in), a bound for ``.gz`` (``unsure_requests``).

Order: the interface promises the lines after the header in time order — a reading or a
warning at its ``t``, a request when it ended (``t_start + e2e_s``,
:func:`llmtop.recording.reader.event_time`). They reach the recorder a moment out of that
order: a GPU or engine reading is stamped when taken and published once read (an engine
scrape is a round trip), and with ``--workers N`` the workers' records come every 0.5 s.
So the writer holds each line ``order_hold_s`` (:data:`ORDER_HOLD_S`; the coordinator of
workers longer) and writes what it holds by time. The hold is at most ``0.75 * flush_s``
(:data:`HOLD_CAP`), so a line is still written within ``0.875 * flush_s`` of being queued
(the hold, then the next pass of the writer: the durability above). A line that comes later
than the hold (an engine scrape slower than it; a coordinator that fell behind) is written
when it comes, and counted: the footer's ``out_of_order``, each part's own, and the
status's, the whole recording's, are the lines written after a later line (in the part; a
failed write's batch is not counted).

Warnings: the saturation monitor publishes a raised warning again (state ``raised``) when
its figures change, for the live view. The recording keeps only the transitions — a code's
first ``raised``, a ``raised`` whose severity changed (``warning`` → ``critical`` and back)
and its ``cleared`` — so a reader pairing raise and clear lines per code counts each episode
once, and a second ``raised`` line for a code still raised means its severity changed (a
warning already raised when the recording starts is written at its first re-publication,
with the figures of that moment).

Rotation (``rotate_bytes`` / ``rotate_s``, off by default): the path given is a stem, and
the recording is a series of parts, ``prod.20261206T140000Z.jsonl.gz`` (the part's UTC
start; ``-2``, ``-3`` when two would share a second), each a complete recording any reader
takes alone: its header (with ``part``, ``previous``, the preceding part's file name, and
``first``, the run's first part's), the warnings still raised when it opened (state
``raised``, with their ``since``), its lines, its footer with its own counts. The writer
thread closes a part between two writes — once the file reaches ``rotate_bytes`` as written
or ``rotate_s`` after it opened — so each line goes to exactly one part, in time order
there. A plain part's batch ends at the line that takes it to ``rotate_bytes``: the part
ends within one line (and its footer) of the limit. A ``.gz`` part's size is the compressed
bytes the compressor has given out, seen after each batch (up to 4,096 lines) and at each
pass's flush; the compressor holds back what it has not yet given out (until its output
block fills, or the pass's flush), so a ``.gz`` part can end past the limit by one batch's
lines compressed plus what the compressor held back (a few kB to tens of kB for typical
lines). A part that cannot be opened (disk full, permission) stops the recording as a
failed write does. ``keep``: the oldest parts of the stem are deleted past that many — this
recorder's and those an earlier run with the same stem left (nothing else is touched) — but
a part another live process is still writing (two recorders on one stem: each locks the
part it writes, :mod:`llmtop.recording.partlock`), which is left until it is closed.

The recording never carries prompt or completion text: the events themselves don't.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import heapq
import json
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, Protocol

import orjson

from llmtop import __version__
from llmtop.bus import EventBus
from llmtop.clock import unix_now
from llmtop.events import (
    ChunkSlice,
    Event,
    RequestRecord,
    WarningEvent,
    outside_dialect,
)
from llmtop.recording.errors import RecordingBusy, RecordingError
from llmtop.recording.partlock import held_elsewhere, lock_part
from llmtop.recording_names import nameless, split_stem

FORMAT = "llmtop-recording"
VERSION = 1

Opener = Callable[[Path, bool], IO[bytes]]
"""``opener(path, overwrite)`` → a binary file object to write to (tests inject slow ones)."""
OnError = Callable[[Path, str], None]
"""``on_error(path, error)``: called once, from the writer thread, when a recording stops
writing (a failed write, the file gone from its path) — the process says so at once, not
only in its summary at exit."""

_BATCH_LINES = 4096  # lines serialised per write() call
_UNFLUSHED_KEEP: Final = 1 << 20
"""The bytes of a plain file's lines written since its last flush that the writer keeps
(beyond the newest batch), to settle its counts against the file's size if a write fails:
more than any write buffer in front of the file holds (``open``'s is 8 kB or the file
system's block size)."""
ORDER_HOLD_S: Final = 0.25
"""How long a line waits in the writer, so that lines published a moment out of time
order are written in it (module docstring); at most ``HOLD_CAP * flush_s``."""
HOLD_CAP: Final = 0.75
"""The longest hold, as a share of ``flush_s``: with the pass after it (``flush_s /
PASSES_PER_FLUSH``) a line is written within 0.875 ``flush_s`` of being queued, inside the
kill -9 bound. (It was 0.6 with a pass every ``flush_s / 4``: the coordinator of
``--workers 2`` then had 0.1 s for a worker's batch to arrive late, and wrote ~1 % of the
lines of a 256-stream recording out of order, by up to 44 ms.)"""
PASSES_PER_FLUSH: Final = 8
"""The writer thread's passes (take what is queued, write, flush) per ``flush_s``."""
QUEUE_MAX_CHUNKS: Final = 4_000_000
"""Default bound on the chunks of the request records queued (~40 B a chunk: ~160 MB)."""


class _Serialisable(Protocol):
    def to_json_dict(self) -> dict[str, Any]: ...


def _default_opener(path: Path, overwrite: bool) -> IO[bytes]:
    return open(path, "wb" if overwrite else "xb")


def part_name(stem: Path, started_at: float, n: int = 1) -> Path:
    """A rotating recording's part: ``prod.jsonl.gz`` → ``prod.20261206T140000Z.jsonl.gz``
    (its UTC start to the second, so parts sort and are found by hour), ``…Z-2.jsonl.gz``
    for the ``n``-th part that would have the same name."""
    base, ext = split_stem(stem.name)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started_at))
    return stem.with_name(f"{base}.{stamp}{f'-{n}' if n > 1 else ''}{ext}")


_REQUEST_FIELDS: Final = tuple(f.name for f in dataclasses.fields(RequestRecord))
_REQUEST_LINE: Final = b'{"type":"request"'
"""How a request's line begins (:func:`event_dict` puts ``type`` first)."""


def event_dict(ev: Any) -> dict[str, Any]:
    """An event's recording line as a dict: its ``to_json_dict()``, except for the
    high-volume request records, built here without ``dataclasses.asdict``'s deep copies
    (tuples stay tuples; JSON writes them as arrays — the same line). ``asdict`` costs
    ~100 µs for a request with a few dozen chunks; this, a few µs."""
    if type(ev) is RequestRecord:
        out: dict[str, Any] = {"type": "request"}
        for n in _REQUEST_FIELDS:
            out[n] = getattr(ev, n)
        out["dialect"] = outside_dialect(ev.dialect)
        return out
    d: dict[str, Any] = ev.to_json_dict()
    return d


def line_time(ev: Any) -> float | None:
    """When a line happened as far as the file's order goes (the reader's ``event_time``):
    a request when it ended, anything else at its ``t``; None for what has neither."""
    if type(ev) is RequestRecord:
        return ev.t_start + ev.e2e_s
    t = getattr(ev, "t", None)
    return float(t) if isinstance(t, float | int) and not isinstance(t, bool) else None


def _finite(obj: Any) -> Any:
    """NaN/inf → None, recursively (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


PIECE: Final = 1024
"""A list longer than this (a long answer's chunk offsets and tokens) is encoded this many
items at a time."""

_SEPARATORS: Final = (",", ":")


def dumps_line(d: Mapping[str, Any]) -> bytes:
    """One recording line: compact JSON, NaN/inf as ``null``, newline-terminated.

    Encoded by orjson (a 16k-chunk record in ~0.5 ms where ``json.dumps`` took ~9 ms):
    strings as UTF-8 (not ``\\u`` escapes), floats in their shortest round-trip form —
    the same values as ``json.dumps(d, separators=(",", ":"))`` wrote, not always the
    same bytes. A top-level list longer than :data:`PIECE` is encoded in pieces of that
    many items, joined, so the GIL can pass between them (the proxy's forwarding thread
    shares it with the writer thread). What orjson refuses — an int past 64 bits, a
    non-string key, a type it does not know — goes through ``json`` as before."""
    try:
        return _orjson_line(d)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        s = _dumps(d)
    except ValueError:
        s = _dumps(_finite(dict(d)))
    return s.encode() + b"\n"


_odumps: Final = orjson.dumps


def _orjson_line(d: Mapping[str, Any]) -> bytes:
    for v in d.values():
        if type(v) in (list, tuple) and len(v) > PIECE:
            break
    else:
        return _odumps(d, option=orjson.OPT_APPEND_NEWLINE)
    parts: list[bytes] = []
    for k, v in d.items():
        if type(k) is not str:
            raise TypeError("a key JSON would convert")
        if type(v) in (list, tuple) and len(v) > PIECE:
            val = b"[" + b",".join(_odumps(v[i:i + PIECE])[1:-1]
                                   for i in range(0, len(v), PIECE)) + b"]"
        else:
            val = _odumps(v)
        parts.append(_odumps(k) + b":" + val)
    return b"{" + b",".join(parts) + b"}\n"


def _dumps(d: Mapping[str, Any]) -> str:
    long = False
    for k, v in d.items():
        if type(k) is not str:
            long = False  # keys JSON would convert: left to json as a whole
            break
        if type(v) in (list, tuple) and len(v) > PIECE:
            long = True
    if not long:
        return json.dumps(d, separators=_SEPARATORS, allow_nan=False)
    parts: list[str] = []
    for k, v in d.items():
        if type(v) in (list, tuple) and len(v) > PIECE:
            val = "[" + ",".join(
                json.dumps(v[i:i + PIECE], separators=_SEPARATORS, allow_nan=False)[1:-1]
                for i in range(0, len(v), PIECE)) + "]"
        else:
            val = json.dumps(v, separators=_SEPARATORS, allow_nan=False)
        parts.append(json.dumps(k) + ":" + val)
    return "{" + ",".join(parts) + "}"


class _Counting:
    """Passes writes to the file and counts the bytes (what GzipFile writes through)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


class _Sink:
    """The file, gzip-wrapped for ``.gz`` paths, counting the bytes that reach the file."""

    def __init__(self, raw: IO[bytes], gz: bool) -> None:
        self.raw = raw
        self._out = _Counting(raw)
        self.identity: tuple[int, int] | None = None
        """(device, inode) of a regular file opened (None for what has none: a test's
        file object), to notice the file deleted, moved or replaced under the recorder."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            st = os.fstat(raw.fileno())
            if stat.S_ISREG(st.st_mode):
                self.identity = (st.st_dev, st.st_ino)
        self.gz = gz
        self._gz = (
            gzip.GzipFile(filename="", mode="wb", fileobj=self._out, mtime=0)
            if gz
            else None
        )

    @property
    def nbytes(self) -> int:
        return self._out.bytes

    def write_lines(self, data: bytes) -> None:
        if self._gz is not None:
            self._gz.write(data)
        else:
            self._out.write(data)

    def flush(self) -> None:
        if self._gz is not None:
            self._gz.flush()  # Z_SYNC_FLUSH: everything so far decodes (also flushes raw)
        self.raw.flush()

    def close(self) -> None:
        try:
            if self._gz is not None:
                self._gz.close()  # writes the gzip trailer; leaves raw open
            self.raw.flush()
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.fsync(self.raw.fileno())
        finally:
            self.raw.close()


class Recorder:
    """Writes one recording. ``start()``, then subscribe ``on_events`` to the bus; ``stop()``
    writes the footer and closes the file.

    ``header`` adds to (or overrides) the header's ``upstream``, ``slo`` and
    ``llmtop_version`` and may carry anything else worth keeping with the figures (model,
    hardware, engine version); ``type``, ``format``, ``version`` and ``started_at`` are
    always the recorder's own.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        header: Mapping[str, Any],
        queue_max: int = 100_000,
        flush_s: float = 1.0,
        overwrite: bool = False,
        opener: Opener | None = None,
        queue_max_chunks: int = QUEUE_MAX_CHUNKS,
        order_hold_s: float = ORDER_HOLD_S,
        on_error: OnError | None = None,
        rotate_bytes: int = 0,
        rotate_s: float = 0.0,
        keep: int = 0,
    ) -> None:
        if queue_max < 1:
            raise ValueError("queue_max must be at least 1")
        if queue_max_chunks < 1:
            raise ValueError("queue_max_chunks must be at least 1")
        if flush_s <= 0:
            raise ValueError("flush_s must be positive")
        if rotate_bytes < 0 or rotate_s < 0 or keep < 0:
            raise ValueError("rotate_bytes, rotate_s and keep must be 0 (off) or more")
        self.path = Path(path)
        """The path given: the file, or with rotation the stem the parts are named after."""
        self.rotate_bytes = rotate_bytes
        self.rotate_s = rotate_s
        self.keep = keep
        self.rotating = rotate_bytes > 0 or rotate_s > 0
        self.part_path = self.path
        """The file being written (the current part when rotating)."""
        self.part = 0
        """The current part's number (1, 2, …; 0 before start)."""
        self._parts: deque[tuple[Path, tuple[int, int] | None, bool]] = deque()
        """The parts this recorder made and has not deleted (``keep``), oldest first — after
        those an earlier run with the same stem left, found at start (``True``: an earlier
        run's) — each with its (device, inode) when opened or found."""
        self.others_writing: tuple[Path, ...] = ()
        """Parts of this stem another live process was writing when this recorder started
        (their lock held: :mod:`llmtop.recording.partlock`): two recorders on one stem."""
        self.left_held: set[Path] = set()
        """Parts ``keep`` would have deleted but left, as another live process was writing
        them (deleted at a later prune once that process has closed them)."""
        self.left_held_at_start = 0
        """How many of those the first part's opening left (the start line's count)."""
        self.deleted_earlier = 0
        """Parts an earlier run left that ``keep`` deleted (at start, mostly: a restart
        with a smaller ``keep`` deletes at once what it no longer keeps — said, not
        silent)."""
        self.deleted_earlier_at_start = 0
        """How many of those went when the first part opened (the start line's count; the
        rest went later, as this run's parts took their place: the exit line says so)."""
        self._part_started = 0.0
        self._first_part = ""  # the file name of this run's first part (rotating)
        self._part_lines = 0  # this part's lines, the header included (the footer's count)
        self._part_requests = 0
        self._part_dropped = (0, 0)  # dropped, dropped_requests when this part opened
        self._part_out_of_order = 0
        self._part_newest = -math.inf  # the latest time written to this part
        self.out_of_order = 0
        """Lines written after a later one (each part's own order): lines that reached the
        writer later than its hold, which it writes when they come (see Order above)."""
        self._part_extra: dict[str, Any] = {}
        self._bytes_done = 0  # what reached the parts closed before this one
        self.header_extra = dict(header)
        self.queue_max = queue_max
        self.queue_max_chunks = queue_max_chunks
        self.flush_s = flush_s
        self.overwrite = overwrite
        self._opener: Opener = opener or _default_opener
        self._queue: deque[_Serialisable] = deque()
        self.order_hold_s = max(0.0, min(order_hold_s, HOLD_CAP * flush_s))
        self._held: list[tuple[float, int, _Serialisable]] = []
        """The writer thread's lines not yet written: a heap by (time, arrival)."""
        self._arrivals = 0
        # chunks of the request records queued = in - out; each counter is written by one
        # thread only (in: the event loop's on_events; out: the writer thread)
        self._chunks_in = 0
        self._chunks_out = 0
        self._running = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sink: _Sink | None = None
        self._lock = threading.Lock()  # guards the sink between the thread and stop()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._dropped_full = 0  # counted on the event loop (queue full)
        self._dropped_full_requests = 0
        self._dropped_write = 0  # counted in the writer thread (write failed)
        self._dropped_write_requests = 0
        self._bytes_final = 0
        self.requests = 0
        self.lines = 0
        self._flushed = (0, 0, 0, 0, 0)
        """(lines, requests, part lines, part requests, the part's bytes) when the file last
        held everything counted: its header written, or a pass's flush done."""
        self._unflushed: deque[tuple[list[bytes], int, int]] = deque()
        """The batches (lines, requests, bytes) written since then: what a failed write or
        flush may have left out of the file, in part (:meth:`_settle`). A plain file's
        keep their lines (the newest :data:`_UNFLUSHED_KEEP` bytes only); a ``.gz``
        file's, their counts."""
        self._unflushed_bytes = 0
        self.unsure_requests = 0
        """Requests that may or may not be in the file: those written to a ``.gz`` stream
        since its last flush when a write failed (its compressed bytes on disk cannot be
        taken back to lines). A plain file's are settled exactly, from its size."""
        self.counts_settled = False
        """Whether the counts were settled against the file when it stopped writing (a failed
        write or flush): exact for a plain file, a bound (``unsure_requests``) for ``.gz``."""
        self.error: str | None = None
        self.on_error = on_error
        self._untold = False
        self._footer: dict[str, Any] | None = None
        self.open_at_stop: int | None = None
        """Requests still open in the proxy when the recording stopped (never written: a
        record is written when its request ends); None until then, or when not known
        (the footer's ``open_at_stop``, written only when known)."""
        self._raised: dict[str, WarningEvent] = {}
        """Warning codes whose raise this recording holds and whose clear it does not yet,
        with their latest ``raised`` event (the severity last written; the writer thread's
        own)."""
        self._since: dict[str, float] = {}
        """When each raised code was first raised (a new part's carried line says so)."""

    @property
    def dropped(self) -> int:
        """Lines not written: queue full (disk slower than traffic) or a failed write."""
        return self._dropped_full + self._dropped_write

    @property
    def dropped_requests(self) -> int:
        """How many of the dropped lines were requests."""
        return self._dropped_full_requests + self._dropped_write_requests

    # -- lifecycle --------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The header line as written (after ``start()``; the current part's)."""
        return self._header_dict(self._part_started if self.part else self.started_at,
                                 self._part_extra)

    def _header_dict(self, started_at: float | None,
                     part_extra: Mapping[str, Any]) -> dict[str, Any]:
        extra = dict(self.header_extra)
        for k in ("type", "format", "version", "started_at"):
            extra.pop(k, None)
        return {
            "type": "header",
            "format": FORMAT,
            "version": VERSION,
            "started_at": started_at,
            "upstream": extra.pop("upstream", None),
            "slo": dict(extra.pop("slo", None) or {}),
            "llmtop_version": extra.pop("llmtop_version", __version__),
            **extra,
            **part_extra,
        }

    def start(self) -> None:
        """Open the file (raising :class:`RecordingError` for an existing file unless
        ``overwrite``, a missing directory or no permission), write the header, start the
        writer thread."""
        if self._running or self._sink is not None:
            raise RecordingError(f"{self.path}: this recorder was already started")
        refuse_other_compression(self.path)
        refuse_nameless(self.path)
        self.started_at = unix_now()
        if self.rotating:
            # (here: the finder reads parts as the reader does, and imports this module)
            from llmtop.recording.parts import named_parts, part_files

            # another live process writing this stem (looked for before this recorder's
            # own first part, whose lock would count): said at start; this one goes on
            self.others_writing = tuple(p for p in named_parts(self.path)
                                        if held_elsewhere(p))
            for found in part_files(self.path) if self.keep else ():
                with contextlib.suppress(OSError):  # (gone since it was listed)
                    st = os.stat(found)
                    self._parts.append((found, (st.st_dev, st.st_ino), True))
        self._open_part(self.started_at)
        self.deleted_earlier_at_start = self.deleted_earlier
        self.left_held_at_start = len(self.left_held)
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name=f"llmtop-recorder:{self.path.name}", daemon=True
        )
        self._thread.start()

    def _open(self, path: Path, overwrite: bool) -> IO[bytes]:
        """The opener's file, its failures as one-line :class:`RecordingError` s
        (``FileExistsError`` passes: with rotation the next name is tried)."""
        try:
            return self._opener(path, overwrite)
        except FileExistsError:
            raise
        except FileNotFoundError:
            # (a directory that exists but takes no new files, such as /proc, says ENOENT)
            why = ("cannot create a file there" if path.parent.is_dir()
                   else "directory does not exist")
            raise RecordingError(f"{path}: {why}") from None
        except IsADirectoryError:
            raise RecordingError(f"{path}: is a directory") from None
        except PermissionError:
            raise RecordingError(f"{path}: permission denied") from None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise RecordingBusy(f"{path}: cannot open for writing now: "
                                    f"{exc.strerror} (llmtop is out of file descriptors); "
                                    "retry later") from None
            raise RecordingError(f"{path}: cannot open for writing: {exc.strerror}") from None

    def _open_part(self, started_at: float) -> None:
        """Open the file (the next part's, when rotating), write its header — and for a
        part after the first the warnings still raised — and make it the one written to.
        :class:`RecordingError` when it cannot be, leaving no empty or half-header file."""
        previous = self.part_path.name if self.part else None
        if not self.rotating:
            path, overwrite = self.path, self.overwrite
            try:
                raw = self._open(path, overwrite)
            except FileExistsError:
                raise RecordingError(exists_message(path)) from None
        else:
            overwrite, n = False, 1
            while True:  # a name taken (two parts in one second, another run's): the next
                path = part_name(self.path, started_at, n)
                try:
                    raw = self._open(path, overwrite)
                    break
                except FileExistsError:
                    if n >= 1000:
                        raise RecordingError(exists_message(path)) from None
                    n += 1
        if self.rotating:  # before its header: a file is a part to others once it has one
            with contextlib.suppress(OSError, ValueError, AttributeError):  # (no descriptor)
                lock_part(raw.fileno())
        sink = _Sink(raw, path.name.endswith(".gz"))
        # (``first``: the run's first part, the same in each of its parts: a reader groups
        # two runs' parts on one stem exactly, however many of them keep deleted)
        first = self._first_part or path.name
        part_extra = ({"part": self.part + 1, "previous": previous, "first": first}
                      if self.rotating else {})
        lines = [dumps_line(self._header_dict(started_at, part_extra))]
        if self.part:
            lines += [self._carried(code, ev, started_at) for code, ev in self._raised.items()]
        try:
            sink.write_lines(b"".join(lines))
            sink.flush()
        except OSError as exc:
            with contextlib.suppress(OSError):  # (its flush fails again: a full disk)
                sink.close()
            if sink.identity is not None and not overwrite:  # the file this made: no
                with contextlib.suppress(OSError):  # empty or half-header file is left
                    if os.stat(path).st_ino == sink.identity[1]:
                        path.unlink()
            raise RecordingError(f"{path}: cannot write: {exc.strerror}") from None
        self._sink = sink
        self.part_path = path
        self._first_part = first if self.rotating else ""
        self.part += 1
        self._part_extra = part_extra
        self._part_started = started_at
        self._part_lines = len(lines)
        self._part_requests = 0
        self._part_dropped = (self.dropped, self.dropped_requests)
        self._part_out_of_order = 0
        self._part_newest = -math.inf
        self.lines += len(lines)
        self._mark_flushed(sink)
        if self.rotating and self.keep:  # only keep reads them (without: one per part for good)
            self._parts.append((path, sink.identity, False))
            self._prune()

    def _carried(self, code: str, ev: WarningEvent, t: float) -> bytes:
        """A warning still raised, at the start of a new part: ``raised`` at ``t`` (the
        part's start, so the file stays in time order), ``since`` when it was raised."""
        d = event_dict(ev)
        d["t"] = t
        d["since"] = self._since.get(code, ev.t)
        return dumps_line(d)

    def _prune(self) -> None:
        """Delete the oldest parts past ``keep``: the parts this recorder made and, found
        when it started, those an earlier run with the same stem left (a proxy restarted
        daily with hourly parts and ``keep = 168`` holds a week on disk, not a week per
        restart). Nothing else: a file moved away or replaced since is left alone, and
        a file named like a part whose first line is not a part's header was never
        counted. A part another live process is writing (its lock held: two recorders on
        one stem) is left, and not counted, until a prune finds it closed."""
        held: list[tuple[Path, tuple[int, int] | None, bool]] = []
        while self.keep and len(self._parts) > self.keep:
            path, identity, earlier = entry = self._parts.popleft()
            state = held_elsewhere(path, identity)
            if state:
                held.append(entry)
                self.left_held.add(path)
                continue
            if state is None:  # gone, moved or replaced since: not this recorder's to delete
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                self.deleted_earlier += earlier
        self._parts.extendleft(reversed(held))

    @property
    def queued_chunks(self) -> int:
        """Chunks of the request records queued, not yet written."""
        return self._chunks_in - self._chunks_out

    def on_events(self, batch: Sequence[Event]) -> None:
        """The bus subscriber: enqueue, never block; count what does not fit as dropped
        (more than ``queue_max`` events, or request records whose chunks would take the
        queued chunks past ``queue_max_chunks`` — a record is always taken into an
        empty queue). An open stream's chunk slices are not written: its record holds
        them."""
        if not self._running:
            return
        q = self._queue
        room = self.queue_max - len(q) - len(self._held)
        chunks = 0
        live = False
        for e in batch:
            if type(e) is RequestRecord:
                chunks += len(e.chunk_offsets_s)
            elif type(e) is ChunkSlice:
                live = True
        if live:
            batch = [e for e in batch if type(e) is not ChunkSlice]
        n = len(batch)
        if n <= room and (not chunks or self.queued_chunks + chunks <= self.queue_max_chunks):
            self._chunks_in += chunks
            q.extend(batch)
            return
        self._enqueue_within_bounds(batch, room)

    def _enqueue_within_bounds(self, batch: Sequence[Event], room: int) -> None:
        """``on_events`` one event at a time, near a bound: the events past ``room`` are
        dropped, and a record that would take the queued chunks past ``queue_max_chunks``
        (the events after it may still fit)."""
        q = self._queue
        for e in batch:
            c = len(e.chunk_offsets_s) if type(e) is RequestRecord else 0
            queued = self.queued_chunks
            if room <= 0 or (c and queued and queued + c > self.queue_max_chunks):
                self._dropped_full += 1
                if isinstance(e, RequestRecord):
                    self._dropped_full_requests += 1
                continue
            q.append(e)
            room -= 1
            self._chunks_in += c

    def stop(self, open_at_stop: int | None = None) -> dict[str, Any]:
        """Write what is queued and the footer (``ended_at``, ``requests``, ``dropped``,
        and ``open_at_stop`` when given: the requests still open in the proxy now, which
        this recording will never hold), fsync and close. Returns the final
        :meth:`status`. Idempotent."""
        if self._footer is not None:
            return self.status()
        if open_at_stop is not None:
            self.open_at_stop = max(0, int(open_at_stop))
        self._running = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.ended_at = unix_now()
        self._footer = self._footer_dict(self.ended_at)
        if self.open_at_stop is not None:  # (the last part's only: a rotation carries
            self._footer["open_at_stop"] = self.open_at_stop  # open requests on)
        with self._lock:
            sink, self._sink = self._sink, None
            if sink is not None:
                try:
                    if self.error is None:
                        sink.write_lines(dumps_line(self._footer))
                        self.lines += 1
                    sink.close()
                except OSError as exc:
                    self.error = self.error or f"{exc.strerror or exc}"
                finally:
                    self._bytes_final = self._bytes_done + sink.nbytes
        return self.status()

    def _footer_dict(self, ended_at: float) -> dict[str, Any]:
        """The footer of the part being closed (of the file, without rotation): its own
        requests, lines (the footer included), what was dropped while it was open and its
        lines written after a later one (``out_of_order``)."""
        dropped, dropped_requests = self._part_dropped
        return {
            "type": "footer",
            "ended_at": ended_at,
            "requests": self._part_requests,
            "lines": self._part_lines + 1,
            "dropped": self.dropped - dropped,
            "dropped_requests": self.dropped_requests - dropped_requests,
            "out_of_order": self._part_out_of_order,
        }

    def status(self) -> dict[str, Any]:
        """``path, started_at, requests, lines, dropped, bytes`` (+ ``queued``, ``error``,
        ``ended_at`` once stopped). ``bytes`` counts what reached the file (compressed for
        ``.gz``). With rotation ``path`` is the current part's (the last one once
        stopped), ``part`` its number, ``stem`` the path given, ``deleted_earlier``
        the parts an earlier run with that stem left that ``keep`` deleted and
        ``deleted_earlier_at_start`` how many of them went when the first part opened,
        ``others_writing`` the parts of the stem another live process was writing when
        this recording started (two recorders on one stem), ``left_held`` the parts
        ``keep`` left as another live process was writing them and
        ``left_held_at_start`` how many of those when the first part opened;
        the counts and ``bytes`` are the whole recording's, every part together. Once a
        write or flush failed, ``counts_settled`` says the counts were taken from the file
        (:meth:`_settle`): ``requests`` are then in it, ``unsure_requests`` more may be
        (``.gz``: its last lines, cut off at the failure). ``out_of_order``: the lines
        written after a later line of their part, every part together. ``open_at_stop``:
        once stopped, the requests still open then, which are not in it (None: not known,
        or not stopped)."""
        sink = self._sink
        nbytes = self._bytes_done + sink.nbytes if sink is not None else self._bytes_final
        rotation = ({"part": self.part, "stem": str(self.path),
                     "deleted_earlier": self.deleted_earlier,
                     "deleted_earlier_at_start": self.deleted_earlier_at_start,
                     "others_writing": [str(p) for p in self.others_writing],
                     "left_held": len(self.left_held),
                     "left_held_at_start": self.left_held_at_start}
                    if self.rotating else {})
        return {
            "path": str(self.part_path),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "recording": self._running,
            "requests": self.requests,
            "lines": self.lines,
            "dropped": self.dropped,
            "dropped_requests": self.dropped_requests,
            "queued": len(self._queue) + len(self._held),
            "bytes": nbytes,
            "error": self.error,
            "unsure_requests": self.unsure_requests,
            "counts_settled": self.counts_settled,
            "out_of_order": self.out_of_order,
            "open_at_stop": self.open_at_stop,
            **rotation,
        }

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        period = self.flush_s / PASSES_PER_FLUSH
        while True:
            stopping = self._stop.wait(period)
            self._write_queued(final=stopping)
            if stopping:
                return

    def _write_queued(self, *, final: bool = False) -> None:
        """Take what is queued into the held lines; write, by time, those held
        ``order_hold_s`` (all of them when ``final``)."""
        q = self._queue
        held = self._held
        now = unix_now()
        while q:
            ev = q.popleft()
            t = line_time(ev)
            if t is None or not t <= now:  # none, NaN, or ahead of this clock: as it came
                t = now
            self._arrivals += 1
            heapq.heappush(held, (t, self._arrivals, ev))
        cutoff = math.inf if final else now - self.order_hold_s
        pop = heapq.heappop
        while held and held[0][0] <= cutoff:
            chunk: list[bytes] = []
            requests = 0
            late = 0
            newest = self._part_newest
            # a plain part rotating by size: the batch ends at the line that takes the file
            # to rotate_bytes (the lines after it stay held, for the next part), so a part
            # ends within one line of the limit, not up to a batch past it
            room = self._plain_room()
            while held and held[0][0] <= cutoff and len(chunk) < _BATCH_LINES:
                at, _, ev = pop(held)
                if type(ev) is RequestRecord:
                    self._chunks_out += len(ev.chunk_offsets_s)
                if isinstance(ev, WarningEvent) and not self._is_transition(ev):
                    continue  # a raised warning's new figures: for the live view only
                try:
                    line = dumps_line(event_dict(ev))
                except (TypeError, ValueError, AttributeError):
                    self._dropped_write += 1  # not an event: counted, never kills the thread
                    continue
                chunk.append(line)
                if at < newest:
                    late += 1
                else:
                    newest = at
                if isinstance(ev, RequestRecord):
                    requests += 1
                if room is not None:
                    room -= len(line)
                    if room <= 0:
                        break
            if self.error is not None:
                self._count_lost(chunk, requests)
                continue
            with self._lock:
                sink = self._sink
                if sink is None:
                    return
                data = b"".join(chunk)
                try:
                    sink.write_lines(data)
                except OSError as exc:
                    self._fail(f"write failed: {exc.strerror or exc}")
                    self._settle(sink, chunk, requests)
                    continue
            self.lines += len(chunk)
            self.requests += requests
            self._part_lines += len(chunk)
            self._part_requests += requests
            self._part_newest = newest
            self._part_out_of_order += late
            self.out_of_order += late
            self._written(sink, chunk, requests, len(data))
            if self.rotate_bytes and sink.nbytes >= self.rotate_bytes:
                self._rotate(self._boundary(cutoff, now))
        if self.error is None:
            with self._lock:
                sink = self._sink
                if sink is not None:
                    try:
                        sink.flush()
                    except OSError as exc:
                        self._fail(f"flush failed: {exc.strerror or exc}")
                        self._settle(sink, [], 0)
                    else:
                        self._mark_flushed(sink)
                        self._check_still_there(sink)
            if self.rotating and not final and self._due(now):
                self._rotate(self._boundary(cutoff, now))
        if self._untold:
            self._tell_error()

    def _plain_room(self) -> int | None:
        """The bytes a plain (not ``.gz``) part rotating by size takes before it is closed;
        None when the batch is not cut by size (no ``rotate_bytes``, or a ``.gz`` part,
        whose compressed size is known only as the compressor gives it out)."""
        sink = self._sink
        if not self.rotate_bytes or sink is None or sink.gz:
            return None
        return self.rotate_bytes - sink.nbytes

    def _due(self, now: float) -> bool:
        """Whether the current part is to be closed: its file reached ``rotate_bytes``
        (what the last flush got out: compressed bytes for ``.gz``), or it has been open
        ``rotate_s``."""
        sink = self._sink
        if sink is None:
            return False
        return bool((self.rotate_bytes and sink.nbytes >= self.rotate_bytes)
                    or (self.rotate_s and now - self._part_started >= self.rotate_s))

    def _boundary(self, cutoff: float, now: float) -> float:
        """The instant between two parts (the old one's ``ended_at``, the new one's
        ``started_at``): the next line held, or the hold's cutoff — every line written to
        the old part happened before it, and every line held for the new one after it
        (but one published later than the hold)."""
        t = min(cutoff, now)
        if self._held:
            t = min(t, self._held[0][0])
        return max(t, self._part_started)

    def _rotate(self, boundary: float) -> None:
        """Close the current part with its footer and open the next (the writer thread's,
        between two writes). A failure to close or open is the recording's failure, as a
        failed write is: the lines from then on are counted as dropped."""
        if self.error is not None:
            return
        with self._lock:
            sink = self._sink
            if sink is None:
                return
            self._sink = None
            failed: OSError | None = None
            try:
                sink.write_lines(dumps_line(self._footer_dict(boundary)))
                self.lines += 1
            except OSError as exc:
                failed = exc
            try:
                sink.close()
            except OSError as exc:
                failed = failed or exc
            self._bytes_done += sink.nbytes
            self._bytes_final = self._bytes_done  # (what status() says until the next opens)
            if failed is not None:
                self._fail(f"write failed: {failed.strerror or failed}")
                return
            try:
                self._open_part(boundary)
            except RecordingError as exc:
                self._fail(f"cannot open the next part: {exc}")

    def _check_still_there(self, sink: _Sink) -> None:
        """Stop (as a failed write does) when the file is no longer at its path: deleted,
        its directory removed, moved or replaced. The writes would still succeed — into a
        file no one can open by that name, lost at close for a deleted one — while the
        status and the summary counted them as recorded. One ``stat`` a pass."""
        if sink.identity is None:
            return
        try:
            st = os.stat(self.part_path)
            here = (st.st_dev, st.st_ino) == sink.identity
        except OSError:
            here = False
        if not here:
            self._fail("the file is no longer at its path (deleted, moved or replaced, or "
                       "its directory removed)")

    def _fail(self, error: str) -> None:
        """The recording stops writing (the writer thread's): what is queued from now on is
        counted as dropped; ``on_error`` is told once, after the pass (not under the lock
        that ``stop()`` waits on)."""
        if self.error is None:
            self.error = error
            self._untold = True

    def _tell_error(self) -> None:
        self._untold = False
        if self.on_error is not None and self.error is not None:
            with contextlib.suppress(Exception):  # (a closed stderr must not end the thread)
                self.on_error(self.part_path, self.error)

    def _is_transition(self, ev: WarningEvent) -> bool:
        """Whether ``ev`` raises a code not raised in this recording, changes a raised
        code's severity, or clears one (a clear is always written: it ends whatever the
        reader knows of that code)."""
        if ev.state == "raised":
            was = self._raised.get(ev.code)
            self._raised[ev.code] = ev
            if was is None:
                self._since[ev.code] = ev.t
            return was is None or was.severity != ev.severity
        self._raised.pop(ev.code, None)
        self._since.pop(ev.code, None)
        return True

    def _mark_flushed(self, sink: _Sink) -> None:
        """The file holds everything counted so far (a flush or the header done)."""
        self._flushed = (self.lines, self.requests, self._part_lines, self._part_requests,
                         sink.nbytes)
        self._unflushed.clear()
        self._unflushed_bytes = 0

    def _written(self, sink: _Sink, chunk: list[bytes], requests: int, nbytes: int) -> None:
        """A batch written (once a batch, not a line): kept until the flush. A plain
        file's batches more than :data:`_UNFLUSHED_KEEP` bytes behind the newest are in
        the file whatever fails next (no write buffer in front of it holds that much):
        they are counted as flushed, and not kept."""
        u = self._unflushed
        if sink.gz:
            u.append(([], requests, 0))
            return
        u.append((chunk, requests, nbytes))
        self._unflushed_bytes += nbytes
        while self._unflushed_bytes - u[0][2] >= _UNFLUSHED_KEEP:
            c, r, b = u.popleft()
            self._unflushed_bytes -= b
            lines0, requests0, part_lines0, part_requests0, nbytes0 = self._flushed
            self._flushed = (lines0 + len(c), requests0 + r, part_lines0 + len(c),
                             part_requests0 + r, nbytes0 + b)

    def _settle(self, sink: _Sink, chunk: list[bytes], requests: int) -> None:
        """After a failed write (of ``chunk``) or flush: count what reached the file of the
        lines written since the last flush, the rest as dropped. A full disk takes part of
        a write; counting the whole batch as dropped said fewer requests than the file
        held, counting it as written more. A plain file's size says how many whole lines
        got in; a ``.gz`` file's compressed bytes do not: those lines are counted as
        ``unsure_requests`` (the summary's "up to N more"), neither written nor dropped.
        On the failure path only: the normal path keeps the batches since the flush
        (:meth:`_written`)."""
        batches = [*self._unflushed, *([(chunk, requests, 0)] if chunk else [])]
        self._unflushed.clear()
        self._unflushed_bytes = 0
        self.counts_settled = True
        lines0, requests0, part_lines0, part_requests0, nbytes0 = self._flushed
        self.lines, self.requests = lines0, requests0
        self._part_lines, self._part_requests = part_lines0, part_requests0
        room = self._bytes_in_file(sink)
        if room is None:
            self.unsure_requests += sum(r for _, r, _ in batches)
            return
        room -= nbytes0
        got_lines = got_requests = 0
        for line in (x for c, _, _ in batches for x in c):  # whole lines, up to the size
            room -= len(line)
            if room < 0:
                break
            got_lines += 1
            got_requests += line.startswith(_REQUEST_LINE)
        self.lines += got_lines
        self.requests += got_requests
        self._part_lines += got_lines
        self._part_requests += got_requests
        total_lines = sum(len(c) for c, _, _ in batches)
        total_requests = sum(r for _, r, _ in batches)
        self._dropped_write += total_lines - got_lines
        self._dropped_write_requests += total_requests - got_requests

    @staticmethod
    def _bytes_in_file(sink: _Sink) -> int | None:
        """The plain file's size now (None for ``.gz``, or what has no size)."""
        if sink.gz or sink.identity is None:
            return None
        try:
            return os.fstat(sink.raw.fileno()).st_size
        except (OSError, ValueError, AttributeError):
            return None

    def _count_lost(self, chunk: list[bytes], requests: int) -> None:
        self._dropped_write += len(chunk)
        self._dropped_write_requests += requests


_OTHER_COMPRESSION: Final = {".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz",
                              ".lz4": "lz4", ".zip": "zip", ".7z": "7-zip"}


def exists_message(path: Path) -> str:
    """Why an existing ``path`` is refused: a recording is a new regular file. A device,
    FIFO or socket (``/dev/full``, ``/dev/null``, a symbolic link to one) is named as
    such — "remove the old file" is no advice for ``/dev/null``."""
    try:
        regular = path.is_file()
        folder = not regular and path.is_dir()
    except OSError:
        regular, folder = True, False
    if folder:
        return (f"{path}: is a directory: a recording is written to a new file; give a file "
                f"name in it, e.g. {path / 'llmtop.jsonl.gz'}")
    if not regular:
        return (f"{path}: not a regular file (a device, pipe or socket): a recording is "
                "written to a new file; give the name of one")
    return (f"{path}: file exists (a recording is never overwritten); choose another "
            "name or remove the old file")


def refuse_other_compression(path: Path) -> None:
    """:class:`RecordingError` for a path whose suffix asks for a compression the recorder
    does not write (a ``.jsonl.zst`` would otherwise be plain JSON Lines under that name)."""
    kind = _OTHER_COMPRESSION.get(path.suffix.lower())
    if kind is not None:
        raise RecordingError(
            f"{path}: llmtop writes recordings as .jsonl or .jsonl.gz, not {kind}; "
            "use a .jsonl.gz name for a compressed recording")


def refuse_nameless(path: Path) -> None:
    """:class:`RecordingError` for a path whose file name is only a recording suffix
    (``DIR/.jsonl``: :func:`llmtop.recording_names.nameless`)."""
    why = nameless(str(path))
    if why is not None:
        raise RecordingError(why)


def check_recording_path(path: str, *, overwrite: bool = False, rotating: bool = False) -> None:
    """:class:`RecordingError` when a recorder would certainly refuse ``path`` (an existing
    file unless ``overwrite`` — or ``rotating``: the path is then the parts' stem, never
    written itself —, a directory, a missing or unwritable directory, a compression suffix
    it does not write), without creating anything: a process checks its ``--record``
    before it binds its ports and says it is listening, or starts a run."""
    if not str(path).strip():
        raise RecordingError("recording path is empty")
    p = Path(path)
    refuse_other_compression(p)
    refuse_nameless(p)
    if p.is_dir():
        raise RecordingError(f"{p}: is a directory")
    if p.exists() and not rotating and not (overwrite and p.is_file()):
        raise RecordingError(exists_message(p))
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise RecordingError(f"{p}: directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RecordingError(f"{p}: permission denied")


class RecordingController:
    """Start/stop recordings on a bus — what the admin API, ``--record`` and the TUI's ``r``
    key drive. Implements the admin's ``RecordingControl``: ``start(path) -> dict``,
    ``stop() -> dict``, ``status() -> dict | None`` (None when not recording).

    ``header`` is a mapping or a callable returning one (read at each start, so a header can
    carry conditions learnt after start-up, such as the models seen so far).
    """

    def __init__(
        self,
        bus: EventBus,
        *,
        header: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        queue_max: int = 100_000,
        flush_s: float = 1.0,
        overwrite: bool = False,
        opener: Opener | None = None,
        queue_max_chunks: int = QUEUE_MAX_CHUNKS,
        order_hold_s: float = ORDER_HOLD_S,
        on_error: OnError | None = None,
        rotate_bytes: int = 0,
        rotate_s: float = 0.0,
        keep: int = 0,
        open_count: Callable[[], int] | None = None,
    ) -> None:
        """``rotate_bytes``, ``rotate_s``, ``keep``: each recording started rotates
        (:class:`Recorder`; 0: off). ``open_count``: the requests open in the proxy now
        (every worker's), read when a recording stops — the footer's ``open_at_stop``
        (None: not known, not written)."""
        self.bus = bus
        self.open_count = open_count
        self.rotate_bytes = rotate_bytes
        self.rotate_s = rotate_s
        self.keep = keep
        self.on_error = on_error
        self.order_hold_s = order_hold_s
        self._header = header
        self.queue_max = queue_max
        self.queue_max_chunks = queue_max_chunks
        self.flush_s = flush_s
        self.overwrite = overwrite
        self._opener = opener
        self.recorder: Recorder | None = None
        self.last: dict[str, Any] | None = None
        """The final status of the last recording stopped."""

    def start(self, path: str, *, overwrite: bool | None = None) -> dict[str, Any]:
        """Begin recording to ``path``; :class:`RecordingError` if one is already running or
        the file exists (unless ``overwrite``)."""
        if self.recorder is not None:
            raise RecordingError(
                f"already recording to {self.recorder.part_path}; stop it first")
        if not str(path).strip():
            raise RecordingError("recording path is empty")
        header = self._header() if callable(self._header) else self._header
        rec = Recorder(
            path,
            header=header,
            queue_max=self.queue_max,
            queue_max_chunks=self.queue_max_chunks,
            flush_s=self.flush_s,
            overwrite=self.overwrite if overwrite is None else overwrite,
            opener=self._opener,
            order_hold_s=self.order_hold_s,
            on_error=self.on_error,
            rotate_bytes=self.rotate_bytes,
            rotate_s=self.rotate_s,
            keep=self.keep,
        )
        rec.start()
        self.bus.subscribe(rec.on_events)
        self.recorder = rec
        return rec.status()

    def check(self, path: str) -> None:
        """:class:`RecordingError` when :meth:`start` would certainly refuse ``path`` (see
        :func:`check_recording_path`)."""
        check_recording_path(path, overwrite=self.overwrite,
                             rotating=self.rotate_bytes > 0 or self.rotate_s > 0)

    def stop(self) -> dict[str, Any]:
        """Stop the running recording: unsubscribe, write the footer, close. Returns its
        final status; :class:`RecordingError` when nothing is being recorded."""
        rec = self.recorder
        if rec is None:
            raise RecordingError("not recording")
        # the records of requests that ended already, still on the bus, go in first (they
        # are no longer open: left on it, they were in neither the file nor the count);
        # then the count, read as it stops taking records: a request open now ends after
        # it, unwritten
        self.bus.drain()
        n = self._open_now()
        self.bus.unsubscribe(rec.on_events)
        self.recorder = None
        self.last = rec.stop(open_at_stop=n)
        return self.last

    def _open_now(self) -> int | None:
        """``open_count()``, or None when there is none or it fails (a shared table gone):
        the recording stops all the same, its footer without the count."""
        if self.open_count is None:
            return None
        try:
            n = self.open_count()
        except (OSError, ValueError, RuntimeError):
            return None
        return n if type(n) is int and n >= 0 else None

    def status(self) -> dict[str, Any] | None:
        rec = self.recorder
        return None if rec is None else rec.status()
