"""Reading recordings back: streaming, tolerant of a crash, strict about what a recording is.

A file is read a megabyte at a time (gzip detected by its magic bytes, decompressed
incrementally, so a ``.jsonl.gz`` cut off by ``kill -9`` reads back up to its last sync
flush), line by line; a multi-GB recording never sits in memory. The first line must be a
version-1 ``header``; anything else is a :class:`RecordingError` with a one-line message.
A last line cut off by a crash is ignored and counted (``truncated_lines``); a broken line in
the middle (a disk error) is skipped and counted (``bad_lines``), and so is a line whose values
no recorder writes (NaN, a string for a number, a time far outside the recording: see
:meth:`RecordingReader.events` and :mod:`llmtop.recording.validate`) — every consumer reads
through here, so report, replay and export agree on what they skip; a line of a type this
version does not know is skipped and counted (``unknown_lines``); a request lacking optional
fields is read with their defaults and counted (``defaulted_lines``). ``problems`` says what
the first few of these lines were.
"""

from __future__ import annotations

import codecs
import itertools
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final

import orjson

from llmtop.events import Event, RequestRecord
from llmtop.recording.errors import RecordingError
from llmtop.recording.validate import (
    MAX_GAP_S,
    MAX_TIME_S,
    InvalidLine,
    clean_slo,
    count,
    engine_from,
    gpu_from,
    number,
    request_from,
    warning_from,
)
from llmtop.recording.writer import FORMAT, VERSION

if TYPE_CHECKING:
    from llmtop.recording.parts import Source

GZIP_MAGIC: Final = b"\x1f\x8b"
OTHER_MAGIC: Final = (
    (b"\xfd7zXZ\x00", "xz", "xz -d"), (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"),
    (b"BZh", "bzip2", "bzip2 -d"), (b"PK\x03\x04", "zip", "unzip"),
    (b"\x04\x22\x4d\x18", "lz4", "lz4 -d"),
)
"""Other compressors' magic bytes: a file beginning so is named as what it is."""
_CHUNK = 1 << 20
_SALVAGE = 4096
"""Compressed bytes decoded at a time after a gzip error, to keep the data before it."""

Progress = Callable[[int, int], None]
"""``progress(bytes_read, total_bytes)`` — bytes of the file on disk (compressed for gz),
called after each MiB read by default (a gzip MiB can hold seconds of parsing): the callback
limits itself by time, as :func:`llmtop.recording.progress.stderr_progress` does."""

MAX_BENCH_STEPS: Final = 10_000
MAX_LINE: Final = 256 << 20
"""Longest line read (256 MiB; a request line of a million chunks is ~15 MB). A longer one
(a crash's zero-filled tail, binary junk glued on) is skipped without being held whole."""
_OVERLONG: Final = b"\0 (a line longer than the reader holds)"
"""Stands in for such a line (by identity); it is not JSON, so it is never an event."""
FOOTER_COUNTS: Final = ("requests", "lines", "dropped", "dropped_requests", "out_of_order")
"""The footer's counts (each an integer in [0, MAX_COUNT]; a rotated recording sums them)."""
FOOTER_LAST_COUNTS: Final = ("open_at_stop",)
"""The footer's counts of the moment it stopped (checked as the others are; a rotated
recording takes its last part's): ``open_at_stop``, the requests still open in the proxy
then, which the recording does not hold (absent from older recordings)."""
MAX_PROBLEMS: Final = 5
"""How many problems ``problems`` describes (every one is counted)."""


def _request(d: dict[str, Any]) -> RequestRecord:
    """A request line → its record (:class:`InvalidLine` when a value cannot be right)."""
    return request_from(d)[0]


_DECODERS: Final[dict[str, Callable[[dict[str, Any]], Event]]] = {
    "gpu": gpu_from,
    "engine": engine_from,
    "warning": warning_from,
}


def decode_event(obj: dict[str, Any]) -> Event | None:
    """One parsed line → its event (``None`` for a header, footer or unknown type);
    :class:`InvalidLine` when its values cannot be right. No time-span check: that needs the
    lines around it (:meth:`RecordingReader.events`)."""
    kind = obj.get("type")
    if kind == "request":
        return request_from(obj)[0]
    dec = _DECODERS.get(kind) if isinstance(kind, str) else None
    return None if dec is None else dec(obj)


def event_time(e: Event) -> float:
    """When the event happened as far as the file's order goes: a request when it
    finished, a reading or warning at its ``t``."""
    if isinstance(e, RequestRecord):
        return e.t_start + e.e2e_s
    return e.t


def loads_line(line: bytes) -> Any:
    """One recording line's JSON: orjson (a 16k-chunk request line in 0.5 ms where
    ``json.loads`` takes 5 ms: most of what replay, report and export spend on long
    answers), and ``json`` for what orjson refuses (``NaN``, lone surrogates, numbers past
    a double), so a line reads as it read before (an integer past 64 bits, which llmtop
    never writes, reads as a float); raises ``ValueError`` as ``json.loads`` does, and
    :class:`TooDeep` (a ``ValueError``) for JSON nested past what a parser recurses into
    (``json.loads`` raised RecursionError: a traceback from every reader)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line)
        except RecursionError:
            raise TooDeep("JSON nested too deeply") from None


def not_utf8(line: bytes) -> str | None:
    """Why ``line`` is not UTF-8 (``not valid UTF-8 (byte 0xff at byte 57)``), or None."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte 0x{line[exc.start]:02x} at byte {exc.start + 1})"
    return None


class TooDeep(ValueError):
    """A line whose JSON is nested deeper than a parser follows (no recorder writes one)."""


def _salvage(d: Any, data: bytes) -> tuple[Any, bytes, bytes, int | None]:
    """``data`` fed to the decompressor ``d`` a slice at a time, and the slice that fails
    again a byte at a time: (the decompressor as it is now, the output up to the first
    error, the bytes after the member when one ended, the index in ``data`` of the byte
    that failed — None when no error came first)."""
    out = []
    for i in range(0, len(data), _SALVAGE):
        piece = data[i:i + _SALVAGE]
        before = d.copy()
        try:
            out.append(d.decompress(piece))
        except zlib.error:
            d = before
            for k in range(len(piece)):
                try:
                    out.append(d.decompress(piece[k:k + 1]))
                except zlib.error:
                    return d, b"".join(out), b"", i + k
                if d.eof:
                    return d, b"".join(out), d.unused_data + data[i + k + 1:], None
            return d, b"".join(out), b"", i + len(piece)  # (the piece failed whole)
        if d.eof:
            return d, b"".join(out), d.unused_data + data[i + _SALVAGE:], None
    return d, b"".join(out), b"", None


def utf16_codec(first: bytes) -> str | None:
    """The UTF-16 codec a file beginning with ``first`` is written in, or None: a byte-order
    mark, or a JSON object's ``{"`` with a zero byte beside each (not UTF-32's marks)."""
    if first.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return None
    if first.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if first.startswith(b'{\x00"\x00'):
        return "utf-16-le"
    if first.startswith(b'\x00{\x00"'):
        return "utf-16-be"
    return None


def _to_utf8(enc: str, first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """UTF-16 chunks as UTF-8 (incremental: a character split between chunks is whole)."""
    dec = codecs.getincrementaldecoder(enc)("replace")
    for b in itertools.chain((first,), rest):
        out = dec.decode(b)
        if out:
            yield out.encode("utf-8", "surrogatepass")
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail.encode("utf-8", "surrogatepass")


class _Chunks:
    """The file's decoded bytes in chunks; gzip (one or several members) decoded as it goes.
    A gzip stream that ends early (a killed writer) simply ends: ``gz_incomplete`` says so."""

    def __init__(self, fh: IO[bytes], progress: Progress | None, total: int,
                 progress_every: int, name: str = "") -> None:
        self.fh = fh
        self.name = name
        """The file's name, for the error a failed read raises."""
        self.progress = progress
        self.total = total
        self.progress_every = progress_every
        self.read_bytes = 0
        self.gz_incomplete = False
        self.gz_damaged_at: int | None = None
        """Where (a byte offset in the file) the compressed data stopped decoding when more
        than zero bytes follow it: damage, not the end a killed writer leaves."""
        self._next_report = progress_every
        self.utf16 = False
        """The file is UTF-16 (a byte-order mark, or a first line so encoded), read as such."""

    def _raw(self) -> Iterator[bytes]:
        while True:
            try:
                b = self.fh.read(_CHUNK)
            except OSError as exc:  # EIO (a failing disk, a lost NFS server): one line, not a
                # traceback (RecordingError: the CLI exits 2, as for a file it cannot open)
                raise RecordingError(f"{self.name}: cannot read: {exc.strerror or exc}") \
                    from None
            if not b:
                if self.progress is not None:
                    self.progress(self.read_bytes, self.total)
                return
            self.read_bytes += len(b)
            if self.progress is not None and self.read_bytes >= self._next_report:
                self._next_report = self.read_bytes + self.progress_every
                self.progress(self.read_bytes, self.total)
            yield b

    def _damage(self, at: int, after: bytes, raw: Iterator[bytes]) -> None:
        """Decoding failed at byte ``at``: damage when anything but zero bytes follows
        (a crash's zero-filled tail is the end of what was written, not damage)."""
        while not after.strip(b"\0"):
            after = next(raw, b"")
            if not after:
                return
        self.gz_damaged_at = at

    @property
    def damage(self) -> str | None:
        """The damage in words (None when there is none)."""
        at = self.gz_damaged_at
        if at is None:
            return None
        return (f"the compressed data is damaged: it stops decoding at byte {at:,} of "
                f"{self.total:,}, and the {max(0, self.total - at):,} bytes from there on "
                "could not be read")

    def __iter__(self) -> Iterator[bytes]:
        raw = self._raw()
        first = next(raw, b"")
        if not first.startswith(GZIP_MAGIC):
            enc = utf16_codec(first)
            if enc is not None:  # (re-saved by Windows PowerShell or an editor)
                self.utf16 = True
                yield from _to_utf8(enc, first, raw)
                return
            if first:
                yield first
            yield from raw
            return
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = first
        while True:
            before = d.copy()
            try:
                out = d.decompress(pending)
                rest = d.unused_data if d.eof else b""
            except zlib.error:
                # corrupt data (a crash's zero-filled tail, a killed member followed by
                # another file): zlib gives nothing of a call that fails, so decode the
                # piece again in small slices and keep what came before the damage
                d, out, rest, failed = _salvage(before, pending)
                if failed is not None:
                    if out:
                        yield out
                    self.gz_incomplete = True
                    # (pending is the end of what was read so far)
                    self._damage(self.read_bytes - len(pending) + failed,
                                 pending[failed:], raw)
                    return
            if out:
                yield out
            if d.eof:
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                if rest and not rest.strip(b"\0"):
                    # zero bytes after a whole member: padding (a preallocated or
                    # block-padded file), which gzip ignores too — not damage (it read
                    # as "ends early" though nothing was lost)
                    rest = b""
                    nxt = next(raw, b"")
                    while nxt and not nxt.strip(b"\0"):
                        nxt = next(raw, b"")
                    if not nxt:
                        return
                    rest = nxt.lstrip(b"\0")  # something after the padding: read on
                if rest:
                    pending = rest
                    continue
                nxt = next(raw, b"")
                if not nxt:
                    return
                pending = nxt
                continue
            nxt = next(raw, b"")
            if not nxt:
                tail = d.flush()
                if tail:
                    yield tail
                self.gz_incomplete = True
                return
            pending = nxt


class RecordingReader:
    """A recording opened for reading. The header is read and checked on construction
    (raising :class:`RecordingError`); iterate for the events in file order; ``footer`` is
    set once iteration reached it (``None`` if the recorder was killed).

    Use as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        progress: Progress | None = None,
        progress_every: int = _CHUNK,
        max_line: int = MAX_LINE,
    ) -> None:
        self.path = Path(path)
        self.max_line = max_line
        self.footer: dict[str, Any] | None = None
        self.truncated_lines = 0
        self.bad_lines = 0
        self.unknown_lines = 0
        self.defaulted_lines = 0
        self.events_read = 0
        self.lines_read = 0
        self.bench_steps: list[dict[str, Any]] = []
        """``bench_step`` lines (``llmtop bench``'s per-level summaries), not events."""
        self.problems: list[str] = []
        """The first few lines skipped or read with defaults, and why (``line N: ...``)."""
        try:
            self._fh: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except FileNotFoundError:
            raise RecordingError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise RecordingError(f"{self.path}: is a directory, not a recording") from None
        except PermissionError:
            raise RecordingError(f"{self.path}: permission denied") from None
        except OSError as exc:
            raise RecordingError(f"{self.path}: cannot read: {exc.strerror}") from None
        try:
            total = os.fstat(self._fh.fileno()).st_size
            self._chunks = _Chunks(self._fh, progress, total, progress_every,
                                   str(self.path))
            self._lines = self._iter_lines()
            self.header = self._read_header()
            if self._chunks.utf16:
                self.problems.insert(0, "the file is UTF-16, not UTF-8 as llmtop writes: "
                                        "read as UTF-16 (iconv -f UTF-16 -t UTF-8 converts it)")
                del self.problems[MAX_PROBLEMS:]
        except BaseException:
            self._fh.close()
            raise
        self._started = False

    # -- context manager -----------------------------------------------------------------

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._fh.close()

    @property
    def total_bytes(self) -> int:
        return self._chunks.total

    @property
    def complete(self) -> bool:
        """True when the file ended with its footer (the recorder was stopped cleanly)."""
        return self.footer is not None

    @property
    def utf16(self) -> bool:
        """The file is UTF-16 (re-saved so), read as such; ``problems`` begins by saying so."""
        return self._chunks.utf16

    # -- lines --------------------------------------------------------------------------------

    def _iter_lines(self) -> Iterator[tuple[bytes, bool]]:
        """(line, ended_with_newline) pairs; the last may lack its newline (a crash). A line
        longer than ``max_line`` comes as ``_OVERLONG``. A line spanning chunks is gathered
        in a list and joined once (adding each chunk to a bytes copied it all again: 100 MB
        without a newline took 3 s, 300 MB 24 s)."""
        pending: list[bytes] = []  # the start of a line that spans chunks
        size = 0  # its length so far; -1 once past max_line (then nothing more is held)
        for chunk in self._chunks:
            if b"\n" not in chunk:
                if size >= 0:
                    size += len(chunk)
                    if size > self.max_line:
                        pending, size = [], -1
                    else:
                        pending.append(chunk)
                continue
            parts = chunk.split(b"\n")
            rest = parts.pop()
            if size < 0 or size + len(parts[0]) > self.max_line:
                parts[0] = _OVERLONG
            elif pending:
                parts[0] = b"".join((*pending, parts[0]))
            for p in parts:
                self.lines_read += 1
                if p is not _OVERLONG and len(p) > self.max_line:
                    p = _OVERLONG
                yield p, True
            pending, size = ([rest] if rest else []), len(rest)
        if size < 0 or pending:
            self.lines_read += 1
            yield (_OVERLONG if size < 0 or size > self.max_line else b"".join(pending)), False

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {self.lines_read}: {text}")

    def _parse(self, line: bytes, complete: bool) -> dict[str, Any] | None:
        if line is _OVERLONG:
            if complete:
                self.bad_lines += 1
                self._problem(f"longer than {self.max_line >> 20} MiB, not a recording's line")
            else:
                self.truncated_lines += 1
            return None
        line = line.strip()
        if not line:
            return None
        try:
            obj = loads_line(line)
        except (ValueError, UnicodeDecodeError) as exc:
            if complete:
                self.bad_lines += 1
                self._problem("JSON nested too deeply (not a recording's line)"
                              if isinstance(exc, TooDeep) else
                              not_utf8(line) or "not JSON")
            else:
                self.truncated_lines += 1
            return None
        if not isinstance(obj, dict):
            self.bad_lines += 1
            self._problem("not a JSON object")
            return None
        return obj

    def _read_header(self) -> dict[str, Any]:
        name = self.path.name
        for line, _complete in self._lines:
            if not line.strip():
                continue
            try:
                obj = loads_line(line)
            except (ValueError, UnicodeDecodeError):
                obj = self._header_replaced(line)
            if obj is None:
                for magic, what, how in OTHER_MAGIC:
                    if line.startswith(magic):
                        raise RecordingError(
                            f"{name}: compressed with {what}, which llmtop does not read "
                            f"(only gzip): decompress it first ({how})") from None
                raise RecordingError(
                    f"{name}: not an llmtop recording (the first line is not JSON)"
                ) from None
            if (
                not isinstance(obj, dict)
                or obj.get("type") != "header"
                or obj.get("format") != FORMAT
            ):
                raise RecordingError(
                    f"{name}: not an llmtop recording (no '{FORMAT}' header on the first line)"
                )
            version = obj.get("version")
            if not isinstance(version, int) or isinstance(version, bool):
                raise RecordingError(f"{name}: recording header has no valid version")
            if version > VERSION:
                raise RecordingError(
                    f"{name}: recording format version {version} is newer than this llmtop "
                    f"reads (version {VERSION}); upgrade llmtop"
                )
            if version < 1:
                raise RecordingError(f"{name}: unknown recording format version {version}")
            return self._clean_header(obj)
        if self._chunks.gz_incomplete:
            raise RecordingError(f"{name}: compressed recording is empty or corrupt")
        raise RecordingError(f"{name}: empty file, not an llmtop recording")

    def _header_replaced(self, line: bytes) -> Any:
        """A first line that is a header but for bytes that are not UTF-8 (a damaged byte
        in its upstream or a name: the whole recording was refused as 'not JSON'): read
        with U+FFFD in their place, and said; None when it is not such a line."""
        why = not_utf8(line)
        if why is None:
            return None
        try:
            obj = loads_line(line.decode("utf-8", "replace").encode())
        except ValueError:
            return None
        if isinstance(obj, dict) and obj.get("type") == "header":
            self._problem(f"{why}; read with U+FFFD in its place")
        return obj

    def _clean_header(self, h: dict[str, Any]) -> dict[str, Any]:
        """Values in the header that cannot be right are dropped (``started_at`` → None, an
        objective that is not a positive number → unset) and noted in ``problems``."""
        started = h.get("started_at")
        if started is not None:
            try:
                number(started, "started_at", lo=1.0, hi=MAX_TIME_S)
            except InvalidLine as exc:
                h["started_at"] = None
                self._problem(f"header {exc}; ignored")
        if "slo" in h:
            h["slo"], dropped = clean_slo(h["slo"])
            for what in dropped:
                self._problem(f"header {what}; ignored")
        return h

    # -- events -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def _other_slo(self, second: dict[str, Any]) -> str:
        """What a concatenated recording's own SLOs mean here, when they differ from the
        first header's: every request is judged against the first's (QA: said nothing)."""
        slo = second.get("slo")
        if not isinstance(slo, dict):
            return ""
        theirs, _ = clean_slo(dict(slo))
        if theirs == clean_slo(self.header.get("slo"))[0]:
            return ""
        return ("; its SLOs differ from the first header's, and every request here is "
                "judged against the first's")

    def events(self) -> Iterator[Event]:
        """The recorded events in file order (each once: the reader is a single pass).

        Lines that cannot be events are skipped and counted (``bad_lines``): not JSON, values
        no recorder writes (:mod:`llmtop.recording.validate`), and times far outside the
        recording: a request starting, or any event happening, more than a day
        (``MAX_GAP_S``) before the header's ``started_at`` unless the next event is there
        too (then the header's time is the damaged one: it is ignored and said), or an
        event more than a day after every event so far unless the next event (or the
        footer) confirms the jump — a gap in a real recording is followed by more events on
        its far side, a damaged time is not.
        """
        if self._started:
            raise RecordingError(f"{self.path.name}: a RecordingReader reads its file once")
        self._started = True
        started = self.header.get("started_at")
        lo = started - MAX_GAP_S if isinstance(started, int | float) else -math.inf
        frontier = started if isinstance(started, int | float) else None
        held: Event | None = None  # an event far past the frontier, awaiting confirmation
        held_t = 0.0
        held_line = ""
        # an event a day before the header's start, awaiting the next: (event, its time,
        # the problem it is if alone, its line number when it was read with defaults)
        early: tuple[Event, float, str, int | None] | None = None
        for line, complete in self._lines:
            obj = self._parse(line, complete)
            if obj is None:
                continue
            kind = obj.get("type")
            try:
                ev: Event
                defaulted = False
                if kind == "request":
                    rec, defaulted = request_from(obj)
                    ev = rec
                else:
                    dec = _DECODERS.get(kind) if isinstance(kind, str) else None
                    if dec is None:
                        if kind == "footer":
                            self.footer = self._clean_footer(obj, held, held_t, frontier)
                        elif kind == "bench_step":  # llmtop bench: one level's summary
                            if len(self.bench_steps) < MAX_BENCH_STEPS:
                                self.bench_steps.append(obj)
                        elif kind == "header":
                            self.bad_lines += 1  # a second header: two files concatenated
                            self._problem("a second header (two recordings concatenated?)"
                                          + self._other_slo(obj))
                        else:
                            self.unknown_lines += 1
                            self._problem(f"unknown line type {str(kind)[:30]!r}")
                        continue
                    ev = dec(obj)
                t = event_time(ev)
            except InvalidLine as exc:
                self.bad_lines += 1
                self._problem(f"{kind}: {exc}")
                continue
            if t < lo or (isinstance(ev, RequestRecord) and ev.t_start < lo):
                if early is not None and abs(t - early[1]) <= MAX_GAP_S:
                    # two events agree, both a day before the header's start: the header
                    # is what is wrong (a damaged digit), not every line after it
                    lo = -math.inf
                    self.header["started_at"] = None
                    self.problems.insert(0, "line 1: header started_at is more than a day "
                                            "after the events; ignored")
                    del self.problems[MAX_PROBLEMS:]
                    frontier = early[1]
                    if early[3] is not None:
                        self._defaulted(early[3])
                    self.events_read += 1
                    yield early[0]
                    early = None
                else:
                    if early is not None:
                        self._reject_early(early[2])
                    what = "t_start is" if isinstance(ev, RequestRecord) else "time is"
                    early = (ev, t, f"line {self.lines_read}: {kind}: {what} more than a day "
                                    "before the recording started",
                             self.lines_read if defaulted else None)
                    continue
            elif early is not None:  # near the start: the early event was an outlier
                self._reject_early(early[2])
                early = None
            if defaulted:
                self._defaulted(self.lines_read)
            if frontier is not None and t > frontier + MAX_GAP_S:
                if held is not None and abs(t - held_t) <= MAX_GAP_S:
                    frontier = max(held_t, t)  # two events agree: a real gap
                    self.events_read += 1
                    yield held
                    held = None
                else:
                    if held is not None:
                        self._reject_held(held_line)
                    held, held_t = ev, t
                    held_line = f"line {self.lines_read}: {kind}"
                    continue
            elif held is not None:  # back near the frontier: the held event was an outlier
                self._reject_held(held_line)
                held = None
            frontier = t if frontier is None else max(frontier, t)
            self.events_read += 1
            yield ev
        if early is not None:
            self._reject_early(early[2])
        if held is not None:
            end = self.footer.get("ended_at") if self.footer else None
            if isinstance(end, int | float) and abs(end - held_t) <= MAX_GAP_S:
                self.events_read += 1
                yield held
            else:
                self._reject_held(held_line)
        self.close()

    def _defaulted(self, line: int) -> None:
        """A request read with defaults for fields it lacks, on line ``line``."""
        self.defaulted_lines += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {line}: request lacks fields; read with their "
                                 "defaults")

    def _reject_early(self, problem: str) -> None:
        self.bad_lines += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)

    def _reject_held(self, where: str) -> None:
        self.bad_lines += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{where}: its time is more than a day after the events "
                                 "around it")

    def _clean_footer(self, obj: dict[str, Any], held: Event | None, held_t: float,
                      frontier: float | None) -> dict[str, Any]:
        """The footer, its ``ended_at`` and counts dropped (None) when they cannot be right
        (a count went out as it was: report's JSON said ``dropped_by_recorder: -3``, and a
        stem summed it into its parts' total)."""
        obj = dict(obj)
        for k in (*FOOTER_COUNTS, *FOOTER_LAST_COUNTS):
            v = obj.get(k)
            if v is None:
                continue
            try:
                count(v, k)
            except InvalidLine as exc:
                self._problem(f"footer {exc}; ignored")
                obj[k] = None
        end = obj.get("ended_at")
        if end is None:
            return obj
        try:
            number(end, "ended_at")
            near = [x for x in (frontier, held_t if held is not None else None)
                    if x is not None]
            if near and not any(abs(end - x) <= MAX_GAP_S for x in near):
                raise InvalidLine("ended_at is more than a day away from the last events")
        except InvalidLine as exc:
            self._problem(f"footer {exc}; ignored")
            return {**obj, "ended_at": None}
        return obj

    def summary(self) -> dict[str, Any]:
        """What was read: counts of events and of lines ignored, and whether it was complete."""
        return {
            "path": str(self.path),
            "events": self.events_read,
            "truncated_lines": self.truncated_lines,
            "bad_lines": self.bad_lines,
            "unknown_lines": self.unknown_lines,
            "defaulted_lines": self.defaulted_lines,
            "problems": list(self.problems),
            "complete": self.complete,
            "gzip_incomplete": self._chunks.gz_incomplete,
            "gzip_damage": self._chunks.damage,
            **recorder_counts(self.footer),
        }


def recorder_counts(footer: Mapping[str, Any] | None) -> dict[str, Any]:
    """The recorder's own counts from its footer, as a summary names them: the events it
    could not write, the lines it wrote after a later one and the requests still open when
    it stopped, not in it (None: no footer, or a footer without the count)."""
    footer = footer or {}
    return {"dropped_by_recorder": footer.get("dropped"),
            "out_of_order_lines": footer.get("out_of_order"),
            "open_at_stop": footer.get("open_at_stop")}


def read_header(path: Source) -> dict[str, Any]:
    """Only the header (and the checks that the file is a readable recording); a rotated
    recording's stem, or its series, gives the series' (:mod:`llmtop.recording.parts`)."""
    from llmtop.recording.parts import open_recording

    with open_recording(path) as r:
        return r.header


def iter_recording(
    path: Source, *, progress: Progress | None = None
) -> Iterator[dict[str, Any] | Event]:
    """The header dict, then every event, then the footer dict (when there is one); a
    rotated recording's stem reads its parts as one."""
    from llmtop.recording.parts import open_recording

    with open_recording(path, progress=progress) as r:
        yield r.header
        yield from r.events()
        if r.footer is not None:
            yield r.footer
