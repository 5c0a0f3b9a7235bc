"""Output paths that must not be a command's input (``report -o``, ``export --hlog`` and
``--parquet`` would otherwise replace the recording they read with their output)."""

from __future__ import annotations

import os
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
