"""A recording given as a pipe, a FIFO, ``<(…)`` or ``-`` (standard input), made readable twice.

``report`` reads its file more than once (the header first, then one or two replays), and
``replay`` seeks; a pipe gives its bytes once. Such an input is copied, as it comes, to a
file in a temporary directory that goes away afterwards; a regular file (or a path that
does not open: the reader says why) is used in place. Before, ``report <(zcat r.gz)`` said
"empty file" (the header check had read the pipe) and ``report FIFO`` hung on the second
open.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

from llmtop.recording.errors import RecordingError

STDIN: Final = "-"
"""The name that means standard input."""
_CHUNK = 1 << 20


def display_name(path: str) -> str:
    """How messages name the input (``-`` is "standard input")."""
    return "standard input" if path == STDIN else path


def needs_copy(path: str) -> bool:
    """Whether ``path`` gives its bytes only once (``-``, a pipe, a FIFO, a socket, a
    character device); False for a regular file and for a path that cannot be looked at."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _copy(src: IO[bytes], dst: IO[bytes], name: str, label: str | None) -> None:
    done, start = 0, time.monotonic()
    last = start
    while True:
        try:
            b = src.read(_CHUNK)
        except OSError as exc:
            raise RecordingError(f"{name}: cannot read: {exc.strerror or exc}") from None
        if not b:
            break
        try:
            dst.write(b)
        except OSError as exc:
            raise RecordingError(f"{name}: cannot keep a copy to read it twice (in "
                                 f"{tempfile.gettempdir()}): {exc.strerror or exc}") from None
        done += len(b)
        now = time.monotonic()
        if label is not None and now - last >= 1.0:
            last = now
            print(f"{label}: reading {name}: {done / 1e6:,.1f} MB", file=sys.stderr,
                  flush=True)


@contextlib.contextmanager
def rereadable(path: str, label: str | None = None) -> Iterator[str]:
    """``path`` itself, or (see :func:`needs_copy`) the path of a temporary copy of what it
    gives, removed when the block ends. ``label`` prefixes a progress line each second of a
    long copy (None: quiet). A :class:`RecordingError` raised in the block names ``path``,
    not the copy."""
    if not needs_copy(path):
        yield path
        return
    name = display_name(path)
    with tempfile.TemporaryDirectory(prefix="llmtop-") as tmp:
        copy = Path(tmp) / (Path(name).name or "input")  # (messages name files by either)
        try:
            src = sys.stdin.buffer if path == STDIN else open(path, "rb")  # noqa: SIM115
        except OSError as exc:
            raise RecordingError(f"{name}: cannot read: {exc.strerror or exc}") from None
        try:
            with open(copy, "wb") as dst:
                _copy(src, dst, name, label)
        except OSError as exc:  # (the close's flush)
            raise RecordingError(f"{name}: cannot keep a copy to read it twice (in "
                                 f"{tempfile.gettempdir()}): {exc.strerror or exc}") from None
        finally:
            if src is not sys.stdin.buffer:
                src.close()
        try:
            yield str(copy)
        except RecordingError as exc:
            raise RecordingError(str(exc).replace(str(copy), name)) from None
