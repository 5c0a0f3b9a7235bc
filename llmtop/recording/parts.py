"""A rotated recording read whole: the stem given to ``--record`` resolved into its parts.

With rotation (:mod:`llmtop.recording.writer`) ``prod.jsonl.gz`` is never written itself:
its parts are ``prod.<UTC start>[-N].jsonl.gz`` beside it, each a complete recording whose
header names its ``part`` number and the ``previous`` part's file. Every command that opens
a recording by path (report, replay, export) goes through :func:`open_recording`, so a
path that is no file but names parts reads them as one recording:

- parts are found by name, then grouped by their headers into *series*: the parts whose
  header names the same ``first`` part (exact, whichever parts are gone), or, for parts
  written before headers had ``first``, a chain of ``previous`` links from a ``part: 1``
  header. A proxy restarted with the same stem starts a new series at part 1; the series
  are separate recordings and the newest is read unless :func:`resolve` is asked for
  another (``--series N``, 1 = the oldest). An older part whose predecessor is gone
  (``keep``, or by hand) joins the latest series before it that ends below the missing
  part (else it begins one); the numbers missing are told.
- read as one: the first part's header (``part``/``previous`` replaced by ``parts``, the
  numbers read, such as ``"1-4, 6"``), each part's events in order, and the warnings a
  part carries at its start (raised at its ``started_at``, repeating a raise the part
  before had) left out while that raise is still open, so a raise/clear pairing counts
  each episode once.
  The footer is the last part's, its counts summed over the parts (``open_at_stop``, a
  count of the moment it stopped, is the last part's own). A last part without
  a footer (a crash) reads as a single file without one does.

A path that exists (a file, a pipe) is read alone, exactly as before: ``report PART`` is
one part.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from llmtop.events import Event, WarningEvent
from llmtop.recording.errors import RecordingError
from llmtop.recording.reader import (
    FOOTER_COUNTS,
    GZIP_MAGIC,
    MAX_PROBLEMS,
    OTHER_MAGIC,
    Progress,
    RecordingReader,
    recorder_counts,
    utf16_codec,
)
from llmtop.recording.validate import clean_slo
from llmtop.recording.writer import FORMAT
from llmtop.recording_names import split_stem

_PEEK: Final = 65536
"""Bytes read of a part to find its header (a header line is well under 1 kB): a day of
hourly parts is 24 small reads, not 24 MiB-sized ones."""


@dataclass(frozen=True)
class Series:
    """The parts of one run of a rotating recorder, in order, chosen among ``count``
    series with the same stem (``index``: 1 = the oldest)."""

    stem: Path
    files: tuple[Path, ...]
    numbers: tuple[int, ...]
    missing: tuple[range, ...]
    """The part numbers below the last that no part has, as ranges (a damaged header's
    part number of 10**30 is one range, not that many numbers)."""
    index: int
    count: int
    notes: tuple[str, ...]
    """What the reader should be told on stderr (older series, missing parts, parts whose
    conditions differ), one line each."""


Source = str | Path | Series
"""What the recording commands read: a file's path, a stem's, or a resolved series."""


def source_path(src: Source) -> Path:
    """The path a source is named by in messages (a series: its stem)."""
    return src.stem if isinstance(src, Series) else Path(src)


def source_files(src: Source) -> list[Path]:
    """The files a source reads (for the output-is-input check)."""
    return list(src.files) if isinstance(src, Series) else [Path(src)]


_NO_HEADER: Final = "does not begin with a part's header"


def _peek_header(path: Path) -> dict[str, Any] | str:
    """A part's header line, read cheaply, or why it has none an llmtop part has."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_PEEK)
    except IsADirectoryError:
        return "is not a file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not data:
        return "is empty"
    if not data.strip(b"\0"):
        # (a crash, a power loss: the file's size reached the disk, its bytes did not)
        return "begins with nothing but zero bytes (its data never reached the disk: a crash?)"
    for magic, what, how in OTHER_MAGIC:
        if data.startswith(magic):
            return (f"is compressed with {what}, which llmtop does not read (only gzip): "
                    f"decompress it first ({how})")
    gzipped = data.startswith(GZIP_MAGIC)
    if gzipped:
        try:
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, _PEEK)
        except zlib.error:
            return _NO_HEADER
    enc = utf16_codec(data)
    if enc is not None and gzipped:  # (RecordingReader decodes UTF-16 only uncompressed)
        return ("is UTF-16 compressed with gzip, which llmtop does not read (zcat it | "
                "iconv -f UTF-16 -t UTF-8 | gzip converts it)")
    # a part re-saved as UTF-16 (Windows PowerShell, an editor) is read as such, as the
    # reader reads it (QA: it was left out as "does not begin with a part's header", its
    # part told as missing, though `report PART` read it whole)
    text = (data.decode(enc, "replace") if enc is not None
            # (a byte that is not UTF-8 read as U+FFFD, as RecordingReader reads the
            # header; a byte-order mark skipped, as json.loads of the bytes did)
            else data.split(b"\n", 1)[0].decode("utf-8-sig", "replace"))
    line = text.split("\n", 1)[0].lstrip("\ufeff")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # (RecursionError: JSON nested too deeply)
        return _NO_HEADER
    if not isinstance(obj, dict) or obj.get("type") != "header" or obj.get("format") != FORMAT:
        return _NO_HEADER
    return obj


@dataclass
class _Part:
    path: Path
    number: int
    previous: str | None
    started_at: float
    header: dict[str, Any]
    first: str | None
    """The file name of its series' first part (written since stop 41; None before)."""


def _named(stem: Path) -> list[tuple[Path, re.Match[str]]]:
    """The files in the stem's folder named like its parts (their names only: nothing is
    opened), each with its name's match (group 1: the ``-N`` after the time)."""
    base, ext = split_stem(stem.name)
    pattern = re.compile(re.escape(base) + r"\.\d{8}T\d{6}Z(?:-(\d+))?" + re.escape(ext) + "$")
    folder = stem.parent if str(stem.parent) else Path(".")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [(folder / name, m) for name in names if (m := pattern.match(name)) is not None]


def named_parts(stem: Path) -> list[Path]:
    """The files named like the stem's parts, by name (nothing is read of them: a
    recorder starting looks for a part another process is writing among these)."""
    return sorted(path for path, _ in _named(stem))


def _parts(stem: Path) -> list[_Part]:
    """The stem's parts in its folder, by start time (files named like parts whose header
    is not a part's are left out)."""
    return _scan(stem)[0]


def _scan(stem: Path) -> tuple[list[_Part], list[tuple[Path, str]]]:
    """:func:`_parts`, and the files named like parts left out, each with why."""
    found: list[tuple[float, int, str, _Part]] = []
    skipped: list[tuple[Path, str]] = []
    for path, m in _named(stem):
        name = path.name
        h = _peek_header(path)
        if isinstance(h, str):
            skipped.append((path, h))
            continue
        number, started = h.get("part"), h.get("started_at")
        if type(number) is not int or number < 1 or not isinstance(started, int | float):
            skipped.append((path, _NO_HEADER))
            continue
        previous, first = h.get("previous"), h.get("first")
        part = _Part(path, number, previous if isinstance(previous, str) else None,
                     float(started), h, first if isinstance(first, str) and first else None)
        found.append((part.started_at, int(m.group(1) or 1), name, part))
    found.sort(key=lambda x: x[:3])
    return [x[3] for x in found], sorted(skipped)


def part_files(stem: Path) -> list[Path]:
    """The files of the stem's parts in its folder, every run's, oldest first (only
    files named like parts whose first line is a part's header)."""
    return [p.path for p in _parts(stem)]


def _series(parts: list[_Part]) -> list[list[_Part]]:
    """Parts grouped into series (module docstring), each in part order, oldest first."""
    series: list[list[_Part]] = []
    of: dict[str, list[_Part]] = {}
    runs: dict[str, list[_Part]] = {}  # by ``first``: exact, whatever keep deleted
    for p in parts:
        if p.first is not None:
            chain = runs.get(p.first)
            if chain is None:
                chain = runs[p.first] = []
                series.append(chain)
            chain.append(p)
            of[p.path.name] = chain
            continue
        chain = of.get(p.previous) if p.previous and p.number > 1 else None
        if chain is None and p.number > 1:
            # its predecessor is gone: the latest series before it whose last part is
            # numbered below the missing one (were it the one before, the link would hold)
            chain = next((s for s in reversed(series) if s[-1].number < p.number - 1),
                         None)
        if chain is None:
            chain = []
            series.append(chain)
        chain.append(p)
        of[p.path.name] = chain
    for s in series:
        s.sort(key=lambda q: (q.number, q.started_at))
    return series


def resolve(path: str | Path, *, series: int | None = None) -> Source:
    """``path`` itself when it exists (a file, a pipe, a directory: the reader says what it
    is) — unless ``series`` is given, which only a stem takes (a regular file with parts
    named after it too: those parts, :func:`file_note`) —, else the series of parts
    named after it (the newest, or the ``series``-th, 1 = the oldest). A
    :class:`RecordingError` when there is neither, or no such series."""
    p = Path(path)
    found: list[list[_Part]] | None = None
    skipped: list[tuple[Path, str]] = []
    if os.path.lexists(p):
        # (a file at the stem itself — an old recording, left where a rotating --record
        # then named its stem — is read alone; --series reads the parts beside it)
        if series is not None and os.path.isfile(p):
            parts, skipped = _scan(p)
            found = _series(parts)
        else:
            found = []
        if not found:
            if series is not None:
                raise RecordingError(f"{p}: a file, read alone: --series picks among the "
                                     "series of a rotated recording, given by its stem")
            return path
    base, ext = split_stem(p.name)
    if found is None:
        parts, skipped = _scan(p)
        found = _series(parts)
    if not found:
        raise RecordingError(f"{p}: no such file, nor parts of a rotated recording named "
                             f"after it ({base}.<time>{ext})")
    count = len(found)
    if series is not None and not 1 <= series <= count:
        raise RecordingError(f"{p}: --series {series}: there "
                             f"{'is 1 series' if count == 1 else f'are {count} series'} "
                             "of parts with this stem")
    index = count if series is None else series
    chosen, copies = _without_copies(found[index - 1], p)
    notes: list[str] = []
    if count > 1:
        others = count - 1
        notes.append(
            f"{p}: {count} series of parts with this stem (the recording was started again "
            "with it: a proxy restarted, or a recording stopped and started): "
            f"reading series {index} (from {chosen[0].path.name}"
            f"{', the newest' if index == count else ''}); "
            f"{others} other{'s' if others > 1 else ''} left out: --series N reads the "
            "N-th (1 = the oldest)")
    notes += copies
    # a file there but not readable as a part is told as such, not as a part deleted
    notes += [f"{p}: {f.name} is named like one of its parts but {why}: left out"
              for f, why in skipped]
    numbers = [q.number for q in chosen]
    missing = missing_ranges(numbers)
    if missing:
        many = len(missing) > 1 or missing[0].stop - missing[0].start > 1
        gone = "deleted, or in a file left out" if skipped else "deleted by keep, or by hand"
        notes.append(f"{p}: part{'s' if many else ''} "
                     f"{_range_text(missing)} of {numbers[-1]} missing ({gone}): "
                     "read the others")
    first = chosen[0].header
    for what in ("upstream", "slo"):
        mine = _condition(first, what)
        other = next((q for q in chosen[1:] if _condition(q.header, what) != mine), None)
        if other is not None:
            notes.append(f"{p}: {other.path.name} was recorded with another "
                         f"{'upstream' if what == 'upstream' else 'set of SLOs'} than "
                         f"{chosen[0].path.name}: the whole is read with the first's")
    return Series(stem=p, files=tuple(q.path for q in chosen), numbers=tuple(numbers),
                  missing=tuple(missing), index=index, count=count, notes=tuple(notes))


def _without_copies(parts: list[_Part], stem: Path) -> tuple[list[_Part], list[str]]:
    """A series' parts less the byte-for-byte copies of a part (a part copied beside
    itself under another part's name: read once, not its requests twice), and what to say
    of them and of a part that is in two different files (each read)."""
    kept: list[_Part] = []
    notes: list[str] = []
    by_number: dict[int, list[_Part]] = {}
    for q in parts:
        same = by_number.setdefault(q.number, [])
        twin = next((o for o in same if _same_bytes(o.path, q.path)), None)
        if twin is not None:
            notes.append(f"{stem}: {q.path.name} is a copy of {twin.path.name} "
                         f"(part {q.number}): left out")
            continue
        same.append(q)
        kept.append(q)
    notes += [f"{stem}: part {n} is in {len(qs)} files "
              f"({', '.join(q.path.name for q in qs)}): each is read"
              for n, qs in by_number.items() if len(qs) > 1]
    return kept, notes


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def file_note(path: str | Path) -> str | None:
    """What to tell of a regular file read alone while parts of a rotated recording are
    named after it too (a rotating ``--record`` given the name of an existing recording:
    the parts went beside it, and the stem reads the old file): that they are there and
    how to read them; None otherwise. A look at the file's folder, made only for a
    regular file (not a pipe, not ``-``)."""
    p = Path(path)
    if not os.path.isfile(p):
        return None
    found = _series(_parts(p))
    if not found:
        return None
    base, ext = split_stem(p.name)
    n = len(found)
    how = ("--series 1 reads them whole" if n == 1 else
           f"--series N reads the N-th series of them whole (1 = the oldest, {n} the newest)")
    return (f"{p}: a file, read alone; parts of a rotated recording are named after it too "
            f"({base}.<time>{ext}, from {found[-1][0].path.name}): {how}")


def _condition(header: dict[str, Any], what: str) -> Any:
    return clean_slo(header.get("slo"))[0] if what == "slo" else header.get(what)


def missing_ranges(numbers: list[int]) -> tuple[range, ...]:
    """The numbers from 1 to ``max(numbers)`` that ``numbers`` (sorted) lacks, as ranges."""
    out: list[range] = []
    prev = 0
    for n in numbers:
        if n > prev + 1:
            out.append(range(prev + 1, n))
        prev = max(prev, n)
    return tuple(out)


def _range_text(ranges: tuple[range, ...]) -> str:
    """``(range(2, 5), range(7, 8))`` → ``2-4, 7``."""
    return ", ".join(str(r.start) if r.stop - r.start == 1 else f"{r.start}-{r.stop - 1}"
                     for r in ranges)


def _ranges(numbers: list[int]) -> str:
    """``[2, 3, 4, 7]`` → ``2-4, 7``."""
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


class SeriesReader:
    """A series of parts read as one recording, with :class:`RecordingReader`'s interface
    (``header``, iteration, ``footer``, the line counts, ``summary()``). Each part is
    opened when the one before it is done; ``progress`` sees the whole series' bytes."""

    def __init__(self, series: Series, *, progress: Progress | None = None) -> None:
        self.series = series
        self.path = series.stem
        self._progress = progress
        self._sizes = [_size(f) for f in series.files]
        self._total = sum(self._sizes)
        self._counts = dict.fromkeys(_COUNTS, 0)
        self.problems: list[str] = []
        self.bench_steps: list[dict[str, Any]] = []
        self.footer: dict[str, Any] | None = None
        self._footers: list[dict[str, Any]] = []
        self._gz_incomplete = False
        self._gz_damage: list[str] = []
        self._last_footer: dict[str, Any] | None = None
        self.carried_lines = 0
        """Warnings a part carried at its start while the raise was still open (skipped)."""
        self._reader: RecordingReader | None = self._open(0)
        h = dict(self._reader.header)
        h.pop("part", None)
        h.pop("previous", None)
        h.pop("first", None)
        h["parts"] = _ranges(list(series.numbers))  # ("1-720": a month of hourly parts)
        self.header = h
        self._started = False

    def _open(self, i: int) -> RecordingReader:
        offset = sum(self._sizes[:i])
        outer = self._progress
        progress = None if outer is None else (
            lambda done, _total: outer(min(offset + done, self._total), self._total))
        return RecordingReader(self.series.files[i], progress=progress)

    def __enter__(self) -> SeriesReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """Every part's events in order, less the warnings carried over (module docstring)."""
        if self._started:
            raise RecordingError(f"{self.path.name}: a reader reads its recording once")
        self._started = True
        raised: dict[str, str] = {}  # code -> severity, as the parts read so far leave it
        for i, f in enumerate(self.series.files):
            if i:
                try:
                    self._reader = self._open(i)
                except RecordingError as exc:  # gone since it was found (keep, mid-read)
                    self._note(f"{exc}; skipped")
                    continue
            r = self._reader
            assert r is not None
            start = r.header.get("started_at")
            for ev in r.events():
                if not i and r.header.get("started_at") is None:
                    # (the first part's reader found its header's start wrong, as is the
                    # series', a copy of it)
                    self.header["started_at"] = None
                if isinstance(ev, WarningEvent):
                    if ev.state == "raised":
                        if (i and ev.t == start and raised.get(ev.code) == ev.severity):
                            self.carried_lines += 1
                            continue
                        raised[ev.code] = ev.severity
                    else:
                        raised.pop(ev.code, None)
                yield ev
            self._finish(r, f)
        self.footer = self._summed_footer()

    def _note(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def _finish(self, r: RecordingReader, f: Path) -> None:
        for k in _COUNTS:
            self._counts[k] += getattr(r, k)
        problems = list(r.problems)
        if r.utf16 and problems:
            # which part is UTF-16 is said even when earlier parts filled the problems told
            # (a part read as UTF-16 is read whole, but the user should convert it)
            self.problems.insert(0, f"{f.name}: {problems.pop(0)}")
            del self.problems[MAX_PROBLEMS:]
        for p in problems:
            self._note(f"{f.name}: {p}")
        self.bench_steps += r.bench_steps
        s = r.summary()
        self._gz_incomplete = self._gz_incomplete or bool(s["gzip_incomplete"])
        if s["gzip_damage"]:
            self._gz_damage.append(f"{f.name}: {s['gzip_damage']}")
        self._last_footer = r.footer
        if r.footer is not None:
            self._footers.append(r.footer)

    def _summed_footer(self) -> dict[str, Any] | None:
        last = self._last_footer
        if last is None:
            return None
        out = dict(last)  # (open_at_stop: the last part's, as it is)
        for k in FOOTER_COUNTS:
            vals = [f.get(k) for f in self._footers]
            # (a part's count missing or ignored as damaged: the sum is not known)
            out[k] = (sum(v for v in vals if type(v) is int)
                      if all(type(v) is int for v in vals) else None)
        return out

    @property
    def truncated_lines(self) -> int:
        return self._counts["truncated_lines"]

    @property
    def bad_lines(self) -> int:
        return self._counts["bad_lines"]

    @property
    def unknown_lines(self) -> int:
        return self._counts["unknown_lines"]

    @property
    def defaulted_lines(self) -> int:
        return self._counts["defaulted_lines"]

    @property
    def events_read(self) -> int:
        return self._counts["events_read"] - self.carried_lines

    @property
    def lines_read(self) -> int:
        return self._counts["lines_read"]

    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def complete(self) -> bool:
        return self.footer is not None

    def summary(self) -> dict[str, Any]:
        """As :meth:`RecordingReader.summary`, for the series (``path``: its stem)."""
        return {
            "path": str(self.path),
            "events": self.events_read,
            "truncated_lines": self.truncated_lines,
            "bad_lines": self.bad_lines,
            "unknown_lines": self.unknown_lines,
            "defaulted_lines": self.defaulted_lines,
            "problems": list(self.problems),
            "complete": self.complete,
            "gzip_incomplete": self._gz_incomplete,
            "gzip_damage": "; ".join(self._gz_damage) or None,
            **recorder_counts(self.footer),
            "parts": [f.name for f in self.series.files],
        }


_COUNTS: Final = ("truncated_lines", "bad_lines", "unknown_lines", "defaulted_lines",
                  "events_read", "lines_read")


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


AnyReader = RecordingReader | SeriesReader


def open_recording(src: Source, *, progress: Progress | None = None) -> AnyReader:
    """The reader for ``src``: a file's own, or (a stem, a series) its parts' as one."""
    if not isinstance(src, Series):
        src = resolve(src)
    if isinstance(src, Series):
        return SeriesReader(src, progress=progress)
    return RecordingReader(src, progress=progress)
