"""Status lines of a long-running process whose reader may leave.

``llmtop run --headless … | head -1`` (or a log shipper that dies): the next line the
proxy printed raised BrokenPipeError, and at start-up that killed the proxy with a
traceback (``recording to …`` came after ``head`` had its line), later a summary or a
warning did. A proxy does not stop forwarding because nobody reads its log: the stream
whose reader left is pointed at ``/dev/null`` and the lines from then on are dropped
(as a shell's own ``2>/dev/null`` would), the exit status unchanged.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


def say(line: str, file: TextIO | None = None) -> None:
    """Print ``line`` (flushed) to ``file`` (default stdout); a reader gone (EPIPE, or
    EIO from a hung-up terminal) silences that stream for good instead of raising."""
    out = sys.stdout if file is None else file
    try:
        print(line, file=out, flush=True)
    except (BrokenPipeError, OSError):
        silence(out)


def silence(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null: what is still buffered, and every
    later write (Python's own flush at exit included), goes nowhere without an error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
