"""``llmtop export FILE (--parquet DIR | --hlog FILE)``."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

from llmtop.cli.common import (
    UsageError,
    add_series_argument,
    check_recording_args,
    refuse_stem_as_output,
    resolve_recording,
    term_as_exit,
    write_failed,
)

NAME = "export"
HELP = "a recording as Parquet tables or HdrHistogram interval logs"
DESCRIPTION = """\
Export a recording (.jsonl or .jsonl.gz) for other tools. A rotated recording's stem (the
path given to --record) exports its parts as one recording.

  --parquet DIR   requests.parquet, gpu.parquet, engine.parquet, warnings.parquet
                  (DuckDB, pandas, Polars, Spark); list columns hold each request's
                  chunk offsets and tokens. DIR is created if missing (not its parents)
  --hlog FILE     HdrHistogram interval logs (values in microseconds), one interval
                  per --interval seconds, tagged ttft, itl, chunk_gap, tpot, e2e —
                  for HistogramLogProcessor, HdrHistogram plotters and the like;
                  FILE - writes the log to standard output (the summary to stderr)

Existing output files are replaced. Each is written under a temporary name and renamed
when complete, so an export that fails or is interrupted (Ctrl-C, SIGTERM) leaves no half
file. A recording still being written, cut off by a crash, or with damaged lines is
exported as far as it reads; a note on stderr says what was skipped (not with -q). Exit status: 0
exported, 2 a user mistake (one line on stderr), 130/143 interrupted.

examples:
  llmtop export today.jsonl.gz --parquet today/
  duckdb -c "select user, quantile_cont(ttft_s, 0.95) from 'today/requests.parquet' group by 1"
  llmtop export today.jsonl.gz --hlog today.hlog --interval 5
  llmtop export today.jsonl.gz --hlog - | HistogramLogAnalyzer ...
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE",
                   help="a recording (.jsonl or .jsonl.gz), or a rotated recording's stem; "
                        "- reads standard input")
    add_series_argument(p)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--parquet", metavar="DIR", help="write Parquet tables into DIR")
    out.add_argument("--hlog", metavar="FILE",
                     help="write HdrHistogram interval logs to FILE (- for stdout)")
    p.add_argument("--interval", type=float, default=10.0, metavar="S",
                   help="hlog interval length in seconds, at least 0.001 (default 10)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress, summary or note lines (exit status only)")


def _outputs(args: argparse.Namespace) -> list[Path]:
    """Every file the export writes (the Parquet directory too: it must not be the input)."""
    if args.hlog:
        return [] if args.hlog == "-" else [Path(args.hlog)]
    from llmtop.recording.paths import PARQUET_TABLES

    out = Path(args.parquet)
    return [out, *(out / f"{name}.parquet" for name in PARQUET_TABLES)]


def _notes(name: str, summary: dict[str, Any]) -> list[str]:
    """What the export could not take from the recording, for stderr (empty when clean)."""
    from llmtop.recording.report.fmt import file_notes

    notes = []
    if summary.get("gzip_damage"):
        pass  # (said by file_notes: where, and how much could not be read)
    elif summary.get("gzip_incomplete"):
        notes.append(f"{name}: the compressed data ends early (cut off by a crash, or still "
                     "being written): exported what it holds")
    elif summary and not summary.get("complete"):
        notes.append(f"{name}: no footer (the recorder was killed or is still running): "
                     "exported what was written so far")
    lines = file_notes(summary)
    if lines:
        notes.append(f"{name}: " + "; ".join(lines))
    return notes


def main(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise UsageError(f"--interval must be a finite number above 0, got {args.interval}")
    if args.interval < 0.001:
        raise UsageError(f"--interval must be at least 0.001 (seconds; the log has millisecond "
                         f"resolution), got {args.interval:g}")
    check_recording_args({"FILE": args.file})
    for flag, value in (("--parquet", args.parquet), ("--hlog", args.hlog)):
        if value is not None and not value.strip():  # (an unset shell variable)
            raise UsageError(f"{flag} '{value}' is empty: give a "
                             f"{'directory' if flag == '--parquet' else 'file name, or -'}")
    if args.parquet == "-":
        raise UsageError("--parquet writes four files into a directory, not to standard "
                         "output: give a directory")
    created = None
    if args.parquet and not Path(args.parquet).exists():
        created = Path(args.parquet)  # removed again if the export fails
    try:
        with term_as_exit():
            return _export(args)
    except BaseException as exc:
        if created is not None:
            with contextlib.suppress(OSError):
                created.rmdir()  # only if still empty: nothing of the user's goes
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            print("llmtop export: interrupted; no output written", file=sys.stderr, flush=True)
        raise


def _export(args: argparse.Namespace) -> int:
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.spool import STDIN, display_name, refuse_endless, rereadable

    if args.file != STDIN:  # (a pipe is read once: export needs no copy of it)
        try:
            refuse_endless(args.file, display_name(args.file))
        except RecordingError as exc:
            raise UsageError(str(exc)) from None
        return _export_file(args, args.file)
    try:
        with rereadable(STDIN) as path:
            return _export_file(args, path)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def _export_file(args: argparse.Namespace, file: str) -> int:
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.parts import source_files
    from llmtop.recording.paths import refuse_input_as_output
    from llmtop.recording.progress import stderr_progress

    src = resolve_recording(file, args.series if file == args.file else None,
                            "llmtop export", quiet=args.quiet)
    progress = None if args.quiet else stderr_progress("llmtop export: read")
    summary: dict[str, Any] = {}
    name = Path(file).name
    refuse_stem_as_output(_outputs(args), [src])
    try:
        refuse_input_as_output(_outputs(args), source_files(src))
        if args.parquet:
            try:
                from llmtop.recording.parquet import export_parquet
            except ImportError:
                raise UsageError(
                    "--parquet needs pyarrow: pip install 'llmtop[report]'"
                ) from None
            rows = export_parquet(src, args.parquet, progress=progress, summary=summary)
            for note in [] if args.quiet else _notes(name, summary):
                print(f"llmtop export: note: {note}", file=sys.stderr, flush=True)
            if not args.quiet:
                parts = ", ".join(f"{name}.parquet {n} rows" for name, n in rows.items())
                print(f"llmtop export: wrote {args.parquet}: {parts}", flush=True)
        else:
            from llmtop.recording.hlog import export_hlog

            counts = export_hlog(src, args.hlog, interval_s=args.interval,
                                 progress=progress, summary=summary)
            for note in [] if args.quiet else _notes(name, summary):
                print(f"llmtop export: note: {note}", file=sys.stderr, flush=True)
            if not args.quiet:
                parts = ", ".join(f"{tag} {n}" for tag, n in counts.items())
                where = "standard output" if args.hlog == "-" else args.hlog
                print(f"llmtop export: wrote {where}: intervals per tag: {parts}",
                      file=sys.stderr if args.hlog == "-" else sys.stdout, flush=True)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except BrokenPipeError:  # `--hlog - | head`: the reader left; stop quietly, as cat does
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        # a write that failed (disk full, file size limit) names no file: the output it was
        where = exc.filename or args.hlog or args.parquet
        why = exc.strerror or str(exc)
        if exc.filename is None and exc.errno is not None:
            why = f"cannot write: {os.strerror(exc.errno)}"  # (pyarrow's words carry its own)
        raise write_failed(f"{where}: {why}", exc) from None
    sys.stdout.flush()
    return 0
