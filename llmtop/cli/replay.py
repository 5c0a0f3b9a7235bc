"""``llmtop replay FILE [--speed X]``: the TUI driven by a recording, as if live."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtop.cli.common import (
    UsageError,
    add_series_argument,
    check_recording_args,
    resolve_recording,
)

if TYPE_CHECKING:
    from llmtop.recording.parts import Source
    from llmtop.recording.replay import ReplaySource

NAME = "replay"
HELP = "the TUI driven by a recording, as if live"
DESCRIPTION = """\
Play a recording (.jsonl or .jsonl.gz) through the same aggregation code as live traffic
and show it in the TUI: space pauses, ←/→ seek 10 s, +/- change the speed. A rotated
recording's stem (the path given to --record) plays its parts as one recording.

examples:
  llmtop replay today.jsonl.gz
  llmtop replay today.jsonl.gz --speed 10 --start 3600
"""

WINDOW_CHOICES = {"10": 10, "60": 60, "300": 300, "all": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE",
                   help="a recording (.jsonl or .jsonl.gz), a rotated recording's stem, or a "
                        "pipe: <(command)")
    add_series_argument(p)
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="playback speed (default 1 = real time; 10 = ten times faster)")
    p.add_argument("--start", type=float, default=0.0, metavar="S",
                   help="start S seconds into the recording")
    p.add_argument("--window", default="60", choices=tuple(WINDOW_CHOICES),
                   help="initial window in seconds, or all (default 60; w cycles it)")
    p.add_argument("--refresh-hz", type=float, default=4.0, metavar="HZ",
                   help="screen refreshes per second (default 4)")


def tui_source(path: Source, *, speed: float = 1.0) -> ReplaySource:
    """A ReplaySource whose refusals are the TUI's ``SourceUnavailable`` (the recording
    package does not import the TUI)."""
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.replay import ReplaySource
    from llmtop.tui.source import SourceUnavailable

    class TuiReplaySource(ReplaySource):
        async def recording(self, action: str, path: str | None) -> dict[str, Any]:
            try:
                return await super().recording(action, path)
            except RecordingError as exc:
                raise SourceUnavailable(str(exc)) from None

    return TuiReplaySource(path, speed=speed)


def main(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.speed) and args.speed > 0):
        raise UsageError(f"--speed must be a finite number above 0, got {args.speed:g}")
    if not (math.isfinite(args.start) and args.start >= 0):
        raise UsageError(f"--start must be ≥ 0, got {args.start:g}")
    if not 0 < args.refresh_hz <= 60:
        raise UsageError(f"--refresh-hz {args.refresh_hz:g} must be in (0, 60]")
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.spool import STDIN, rereadable

    check_recording_args({"FILE": args.file}, stdin=False)
    if args.file == STDIN:
        raise UsageError("replay reads its keys from standard input: give the recording as a "
                         "file (or as <(command))")
    try:
        with rereadable(args.file, "llmtop replay") as path:  # a pipe: from a copy (it seeks)
            return _replay(args, path)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def _replay(args: argparse.Namespace, path: str) -> int:
    """The TUI over ``path``. A rotated recording's notes (other series, missing parts)
    are not printed before it, where its screen would hide them while it runs: the TUI
    shows them as it starts (``ReplaySource.notes``), and they are printed once it has
    ended, where the terminal keeps them, with what the reader skipped in the part of the
    file read (``ReplaySource.read_notes``: bad lines, damaged compressed data)."""
    from llmtop.recording.errors import RecordingError

    try:
        source = tui_source(resolve_recording(path, args.series if path == args.file else None,
                                              "llmtop replay", quiet=True), speed=args.speed)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    try:
        if args.start:
            source.seek(args.start)
        if not sys.stdout.isatty():
            raise UsageError("the TUI needs a terminal; without one, `llmtop report FILE` "
                             "gives the recording's figures")
        from llmtop.tui import run_tui

        return run_tui(source, refresh_hz=args.refresh_hz,
                       window_s=WINDOW_CHOICES[args.window],
                       title=f"llmtop replay {Path(args.file).name}")
    finally:
        for note in source.notes:
            print(f"llmtop replay: {note}", file=sys.stderr, flush=True)
        name = Path(args.file).name
        for note in source.read_notes:
            print(f"llmtop replay: {name}: {note}", file=sys.stderr, flush=True)
        source.engine.close()  # (the TUI closes it when it ran; not when it could not start)
