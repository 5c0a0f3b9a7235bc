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
import select
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
WAKE_S: Final = 0.25
"""How long the copy waits for the input's next bytes before it looks again. A SIGTERM
(or Ctrl-C) can be taken by another thread of the process (numpy's BLAS workers, made when
the report's modules are imported): Python then only marks it, and a read blocked in the
main thread on a silent pipe never returns to act on it (CI saw ``report FIFO`` hang for
good after its SIGTERM). The copy waits with ``select`` instead, so the mark is acted on
within this long."""


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


def _stdin() -> IO[bytes]:
    """Standard input unbuffered (nothing has read from it yet), or as it is when it is no
    file (a test's stand-in)."""
    try:
        return os.fdopen(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both)
        return sys.stdin.buffer


def _waitable(src: IO[bytes]) -> bool:
    try:
        src.fileno()
    except (OSError, ValueError):
        return False
    return True


def _copy(src: IO[bytes], dst: IO[bytes], name: str, label: str | None) -> None:
    """``src`` (unbuffered: each read is one ``read(2)`` of what has come) into ``dst``."""
    done, start = 0, time.monotonic()
    last = start
    wait = _waitable(src)
    while True:
        try:
            if wait and not select.select([src], [], [], WAKE_S)[0]:
                continue  # (a signal marked meanwhile is acted on here, in this thread)
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


def refuse_endless(path: str, name: str) -> None:
    """:class:`RecordingError` for an input that is a device (``/dev/zero`` was copied
    until the disk was full, a disk would be copied whole), standard input included, and
    for standard input that is the terminal (it waited, silently, for a recording to be
    typed)."""
    try:
        fd = sys.stdin.fileno() if path == STDIN else -1
        mode = os.fstat(fd).st_mode if fd >= 0 else os.stat(path).st_mode
    except (AttributeError, OSError, ValueError):  # (a test's stand-in has no fileno)
        return  # (opening it says why)
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        return
    if fd >= 0 and os.isatty(fd):
        raise RecordingError("standard input is a terminal: pipe a recording into it "
                             "(… - < FILE) or name the file")
    raise RecordingError(f"{name}: is a device, not a recording")


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
    refuse_endless(path, name)
    with tempfile.TemporaryDirectory(prefix="llmtop-") as tmp:
        copy = Path(tmp) / (Path(name).name or "input")  # (messages name files by either)
        try:
            # unbuffered, so that a read returns what has come rather than wait for a chunk
            src = _stdin() if path == STDIN else open(path, "rb", buffering=0)  # noqa: SIM115
        except OSError as exc:
            raise RecordingError(f"{name}: cannot read: {exc.strerror or exc}") from None
        try:
            with open(copy, "wb") as dst:
                _copy(src, dst, name, label)
        except OSError as exc:  # (the close's flush)
            raise RecordingError(f"{name}: cannot keep a copy to read it twice (in "
                                 f"{tempfile.gettempdir()}): {exc.strerror or exc}") from None
        finally:
            if src is not getattr(sys.stdin, "buffer", None):
                src.close()  # (standard input's own file stays open: closefd=False)
        try:
            yield str(copy)
        except RecordingError as exc:
            raise RecordingError(str(exc).replace(str(copy), name)) from None
