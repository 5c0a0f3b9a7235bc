"""Output paths that must not be a command's input (``report -o``, ``export --hlog`` and
``--parquet`` would otherwise replace the recording they read with their output)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from llmtop.recording.errors import RecordingError

PARQUET_TABLES: Final = ("requests", "gpu", "engine", "warnings")
"""The tables ``export --parquet`` writes, each as ``<name>.parquet``."""


def part_path(out: Path) -> Path:
    """Where an output is written before it is renamed into place."""
    return out.with_name(f".{out.name}.part")


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (same device and inode: hard links,
    symbolic links and ``./x`` spellings included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_input_as_output(outputs: Iterable[str | Path], inputs: Iterable[str | Path]) -> None:
    """:class:`RecordingError` (one line) when any output, or its ``.part`` file, is one of
    the inputs."""
    ins = list(inputs)
    for out in outputs:
        p = Path(out)
        for cand in (p, part_path(p)):
            for src in ins:
                if same_file(cand, src):
                    raise RecordingError(f"{out}: output is the input file {src}")


def is_special(out: str | Path) -> bool:
    """Whether ``out`` names an existing file that is not a regular file (a device such as
    ``/dev/null``, ``/dev/stdout`` or ``/dev/full``, a FIFO, a socket; through symbolic
    links). Such an output is written in place: renaming a finished ``.part`` file over it
    would replace the device with a regular file (as root, ``report -o /dev/null`` did) or
    fail on a directory the user cannot write, and a write error there must be an error,
    not a "wrote" line."""
    try:
        mode = os.stat(out).st_mode
    except (OSError, ValueError):
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)
