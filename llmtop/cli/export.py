"""``llmtop export FILE (--parquet DIR | --hlog FILE)``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from llmtop.cli.common import UsageError

NAME = "export"
HELP = "a recording as Parquet tables or HdrHistogram interval logs"
DESCRIPTION = """\
Export a recording (.jsonl or .jsonl.gz) for other tools.

  --parquet DIR   requests.parquet, gpu.parquet, engine.parquet, warnings.parquet
                  (DuckDB, pandas, Polars, Spark); list columns hold each request's
                  chunk offsets and tokens
  --hlog FILE     HdrHistogram interval logs (values in microseconds), one interval
                  per --interval seconds, tagged ttft, itl, chunk_gap, tpot, e2e —
                  for HistogramLogProcessor, HdrHistogram plotters and the like

examples:
  llmtop export today.jsonl.gz --parquet today/
  duckdb -c "select user, quantile_cont(ttft_s, 0.95) from 'today/requests.parquet' group by 1"
  llmtop export today.jsonl.gz --hlog today.hlog --interval 5
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a recording (.jsonl or .jsonl.gz)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--parquet", metavar="DIR", help="write Parquet tables into DIR")
    out.add_argument("--hlog", metavar="FILE", help="write HdrHistogram interval logs to FILE")
    p.add_argument("--interval", type=float, default=10.0, metavar="S",
                   help="hlog interval length in seconds (default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary lines")


def _outputs(args: argparse.Namespace) -> list[Path]:
    """Every file the export writes (the Parquet directory too: it must not be the input)."""
    if args.hlog:
        return [Path(args.hlog)]
    from llmtop.recording.paths import PARQUET_TABLES

    out = Path(args.parquet)
    return [out, *(out / f"{name}.parquet" for name in PARQUET_TABLES)]


def main(args: argparse.Namespace) -> int:
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.paths import refuse_input_as_output
    from llmtop.recording.progress import stderr_progress

    if not (math.isfinite(args.interval) and args.interval > 0):
        raise UsageError(f"--interval must be positive, got {args.interval}")
    progress = None if args.quiet else stderr_progress("llmtop export: read")
    try:
        refuse_input_as_output(_outputs(args), [args.file])
        if args.parquet:
            try:
                from llmtop.recording.parquet import export_parquet
            except ImportError:
                raise UsageError(
                    "--parquet needs pyarrow: pip install 'llmtop[report]'"
                ) from None
            rows = export_parquet(args.file, args.parquet, progress=progress)
            if not args.quiet:
                parts = ", ".join(f"{name}.parquet {n} rows" for name, n in rows.items())
                print(f"llmtop export: wrote {args.parquet}: {parts}", flush=True)
        else:
            from llmtop.recording.hlog import export_hlog

            counts = export_hlog(args.file, args.hlog, interval_s=args.interval,
                                 progress=progress)
            if not args.quiet:
                parts = ", ".join(f"{tag} {n}" for tag, n in counts.items())
                print(f"llmtop export: wrote {args.hlog}: intervals per tag: {parts}",
                      flush=True)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None
    sys.stdout.flush()
    return 0
