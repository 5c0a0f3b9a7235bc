"""Progress lines for long reads (report / export of big recordings), on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from llmtop.recording.reader import Progress


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


def stderr_progress(label: str, *, min_interval_s: float = 1.0,
                    stream: TextIO | None = None) -> Progress:
    """A reader ``progress`` callback printing ``label: 42% (120 MB of 290 MB)`` at most once
    per ``min_interval_s`` — and nothing at all for a read that finishes quickly. The first
    call that reaches the size (its last, as a rule) is printed at once; a file that grew
    since it was opened (a live recording) reads on past it at 100%, once a second."""
    out = stream or sys.stderr
    start = time.monotonic()
    last = [start]
    shown = [False]
    reached = [False]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total
        if now - start < min_interval_s and not (finished and shown[0]):
            return
        if now - last[0] < min_interval_s and not (finished and not reached[0]):
            return
        last[0] = now
        shown[0] = True
        reached[0] = reached[0] or finished
        total = max(total, done)
        pct = 100.0 * done / total if total else 100.0
        print(f"{label}: {pct:.0f}% ({_mb(done)} of {_mb(total)})", file=out, flush=True)

    return progress
