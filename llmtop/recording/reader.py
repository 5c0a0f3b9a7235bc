"""Reading recordings back: streaming, tolerant of a crash, strict about what a recording is.

A file is read a megabyte at a time (gzip detected by its magic bytes, decompressed
incrementally, so a ``.jsonl.gz`` cut off by ``kill -9`` reads back up to its last sync
flush), line by line; a multi-GB recording never sits in memory. The first line must be a
version-1 ``header``; anything else is a :class:`RecordingError` with a one-line message.
A last line cut off by a crash is ignored and counted (``truncated_lines``); a broken line in
the middle (a disk error) is skipped and counted (``bad_lines``); a line of a type this
version does not know is skipped and counted (``unknown_lines``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from llmtop.events import EngineReading, Event, GpuReading, RequestRecord, WarningEvent
from llmtop.recording.errors import RecordingError
from llmtop.recording.writer import FORMAT, VERSION

GZIP_MAGIC: Final = b"\x1f\x8b"
_CHUNK = 1 << 20

Progress = Callable[[int, int], None]
"""``progress(bytes_read, total_bytes)`` — bytes of the file on disk (compressed for gz)."""

_REQUEST_FIELDS: Final = tuple(f.name for f in dataclasses.fields(RequestRecord))


def _request(d: dict[str, Any]) -> RequestRecord:
    """``RequestRecord.from_json_dict`` without its per-call ``dataclasses.fields`` and
    generator overhead (the reader's hot path: a third of the time on a big file)."""
    kw: dict[str, Any] = {n: d.get(n) for n in _REQUEST_FIELDS}
    kw["chunk_offsets_s"] = tuple(map(float, d.get("chunk_offsets_s") or ()))
    kw["chunk_tokens"] = tuple(map(int, d.get("chunk_tokens") or ()))
    kw["concurrency_at_start"] = int(d.get("concurrency_at_start") or 0)
    return RequestRecord(**kw)


def _engine(d: dict[str, Any]) -> EngineReading:
    """JSON has no infinity: the writer maps the ``+Inf`` bucket's bound to null; read it
    back as ``inf``."""
    buckets = d.get("ttft_buckets")
    if buckets:
        d = {**d, "ttft_buckets": [(math.inf if le is None else le, c) for le, c in buckets]}
    return EngineReading.from_json_dict(d)


_DECODERS: Final[dict[str, Callable[[dict[str, Any]], Event]]] = {
    "request": _request,
    "gpu": GpuReading.from_json_dict,
    "engine": _engine,
    "warning": WarningEvent.from_json_dict,
}


class _Chunks:
    """The file's decoded bytes in chunks; gzip (one or several members) decoded as it goes.
    A gzip stream that ends early (a killed writer) simply ends: ``gz_incomplete`` says so."""

    def __init__(self, fh: IO[bytes], progress: Progress | None, total: int,
                 progress_every: int) -> None:
        self.fh = fh
        self.progress = progress
        self.total = total
        self.progress_every = progress_every
        self.read_bytes = 0
        self.gz_incomplete = False
        self._next_report = progress_every

    def _raw(self) -> Iterator[bytes]:
        while True:
            b = self.fh.read(_CHUNK)
            if not b:
                if self.progress is not None:
                    self.progress(self.read_bytes, self.total)
                return
            self.read_bytes += len(b)
            if self.progress is not None and self.read_bytes >= self._next_report:
                self._next_report = self.read_bytes + self.progress_every
                self.progress(self.read_bytes, self.total)
            yield b

    def __iter__(self) -> Iterator[bytes]:
        raw = self._raw()
        first = next(raw, b"")
        if not first.startswith(GZIP_MAGIC):
            if first:
                yield first
            yield from raw
            return
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = first
        while True:
            try:
                out = d.decompress(pending)
            except zlib.error:
                self.gz_incomplete = True  # corrupt tail: keep what decoded
                return
            if out:
                yield out
            if d.eof:
                rest = d.unused_data
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
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
        progress_every: int = 64 << 20,
    ) -> None:
        self.path = Path(path)
        self.footer: dict[str, Any] | None = None
        self.truncated_lines = 0
        self.bad_lines = 0
        self.unknown_lines = 0
        self.events_read = 0
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
            self._chunks = _Chunks(self._fh, progress, total, progress_every)
            self._lines = self._iter_lines()
            self.header = self._read_header()
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
    def bytes_read(self) -> int:
        return self._chunks.read_bytes

    @property
    def total_bytes(self) -> int:
        return self._chunks.total

    @property
    def complete(self) -> bool:
        """True when the file ended with its footer (the recorder was stopped cleanly)."""
        return self.footer is not None

    # -- lines --------------------------------------------------------------------------------

    def _iter_lines(self) -> Iterator[tuple[bytes, bool]]:
        """(line, ended_with_newline) pairs; the last may lack its newline (a crash)."""
        buf = b""
        for chunk in self._chunks:
            buf += chunk
            if b"\n" not in chunk:
                continue
            parts = buf.split(b"\n")
            buf = parts.pop()
            for p in parts:
                yield p, True
        if buf:
            yield buf, False

    def _parse(self, line: bytes, complete: bool) -> dict[str, Any] | None:
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            if complete:
                self.bad_lines += 1
            else:
                self.truncated_lines += 1
            return None
        if not isinstance(obj, dict):
            self.bad_lines += 1
            return None
        return obj

    def _read_header(self) -> dict[str, Any]:
        name = self.path.name
        for line, _complete in self._lines:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, UnicodeDecodeError):
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
            return obj
        if self._chunks.gz_incomplete:
            raise RecordingError(f"{name}: compressed recording is empty or corrupt")
        raise RecordingError(f"{name}: empty file, not an llmtop recording")

    # -- events -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """The recorded events in file order (each once: the reader is a single pass)."""
        if self._started:
            raise RecordingError(f"{self.path.name}: a RecordingReader reads its file once")
        self._started = True
        for line, complete in self._lines:
            obj = self._parse(line, complete)
            if obj is None:
                continue
            kind = obj.get("type")
            dec = _DECODERS.get(kind) if isinstance(kind, str) else None
            if dec is None:
                if kind == "footer":
                    self.footer = obj
                elif kind == "header":
                    self.bad_lines += 1  # a second header: two files concatenated
                else:
                    self.unknown_lines += 1
                continue
            try:
                ev = dec(obj)
            except (KeyError, TypeError, ValueError):
                self.bad_lines += 1
                continue
            self.events_read += 1
            yield ev
        self.close()

    def summary(self) -> dict[str, Any]:
        """What was read: counts of events and of lines ignored, and whether it was complete."""
        return {
            "path": str(self.path),
            "events": self.events_read,
            "truncated_lines": self.truncated_lines,
            "bad_lines": self.bad_lines,
            "unknown_lines": self.unknown_lines,
            "complete": self.complete,
            "gzip_incomplete": self._chunks.gz_incomplete,
        }


def read_header(path: str | Path) -> dict[str, Any]:
    """Only the header (and the checks that the file is a readable recording)."""
    with RecordingReader(path) as r:
        return r.header


def iter_recording(
    path: str | Path, *, progress: Progress | None = None
) -> Iterator[dict[str, Any] | Event]:
    """The header dict, then every event, then the footer dict (when there is one)."""
    with RecordingReader(path, progress=progress) as r:
        yield r.header
        yield from r.events()
        if r.footer is not None:
            yield r.footer
