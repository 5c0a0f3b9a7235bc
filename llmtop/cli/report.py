"""``llmtop report FILE [FILE2] [--format text|json|html] [-o OUT]``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from llmtop.cli.common import (
    UsageError,
    add_slo_spec_argument,
    check_recording_args,
    refuse_stem_as_output,
    resolve_recording,
    slo_from_args,
    term_as_exit,
    write_failed,
)
from llmtop.recording.report.slowest import SLOWEST

NAME = "report"
HELP = "offline analysis of a recording (text, JSON or an HTML page with plots)"
DESCRIPTION = """\
Analyse a recording (.jsonl or .jsonl.gz): the conditions it was made under (upstream,
models, SLOs, duration, input/output lengths, concurrency, arrival rate), then TTFT, ITL,
chunk gap, TPOT and E2E percentiles, system and per-user tokens/s, errors and timeouts,
SLO attainment, goodput, capacity at SLO, the warnings that fired, GPU peaks, and the
slowest requests by TTFT and by E2E, each with llmtop's id and the engine's (upstream id),
to find them in the engine's logs. The figures come from the same aggregation code as the
live view.

A rotated recording (recording.rotate_mb / rotate_s) is read whole when FILE is the stem
given to --record (prod.jsonl.gz for its parts prod.<time>.jsonl.gz): its parts in order,
as one recording; a part's own name reads that part alone.

With two files: a side-by-side comparison that warns (and withholds the ratios) when the
recordings' conditions differ.

examples:
  llmtop report today.jsonl.gz
  llmtop report today.jsonl.gz --format html -o today.html
  llmtop report before.jsonl.gz after.jsonl.gz
  llmtop report today.jsonl.gz --slo-ttft 0.3 --format json -o today.json
  llmtop report prod.jsonl.gz --series 1      (a stem: the first run's parts)
  llmtop report prod.jsonl.gz prod.jsonl.gz --series 1,2   (before and after a restart)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE",
                   help="a recording (.jsonl or .jsonl.gz), or a rotated recording's stem; "
                        "- reads standard input")
    p.add_argument("file2", metavar="FILE2", nargs="?", help="a second recording to compare")
    p.add_argument("--series", type=series_spec, metavar="N[,M]",
                   help="a rotated recording given by its stem reads its newest series of "
                        "parts (a proxy restarted with the same --record starts a new one); "
                        "N reads the N-th instead, 1 = the oldest; with two: N,M reads the "
                        "N-th of FILE and the M-th of FILE2 (one N: the N-th of each)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="output format (default text)")
    p.add_argument("-o", "--output", metavar="OUT", help="write to OUT instead of stdout")
    add_slo_spec_argument(p, "(default: the recording's)")
    p.add_argument("--slo-ttft", type=float, metavar="S",
                   help="judge against this TTFT SLO instead of the recording's")
    p.add_argument("--slo-itl-p95", type=float, metavar="S", help="per-request ITL p95 SLO")
    p.add_argument("--slo-tpot", type=float, metavar="S", help="TPOT SLO in seconds")
    p.add_argument("--slo-e2e", type=float, metavar="S", help="end-to-end SLO in seconds")
    p.add_argument("--slo-target", type=float, metavar="F", help="attainment target (0-1]")
    p.add_argument("--slowest", type=int, metavar="N", default=SLOWEST,
                   help=f"name the N slowest requests by TTFT and by E2E (default {SLOWEST}; "
                        "0 leaves the section out; a comparison's text and HTML show none)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def series_spec(text: str) -> tuple[int, ...]:
    """``--series N`` or ``N,M`` (FILE's and FILE2's: the series of one stem before and
    after a restart compared — one N read from each file could not do it)."""
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not 1 <= len(out) <= 2:
        raise argparse.ArgumentTypeError(f"'{text}' is not N or N,M (e.g. 1, or 1,2)")
    return out


def check_output(path: str) -> Path:
    """Fail early (before a long analysis) when OUT cannot be written."""
    from llmtop.recording.paths import is_special

    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{out}: is a directory")
    if is_special(out):  # written in place (write_output): its directory does not matter
        if not os.access(out, os.W_OK):
            raise UsageError(f"{out}: permission denied")
        return out
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UsageError(f"{out}: permission denied")
    probe_output_directory(out)
    return out


def probe_output_directory(out: Path) -> None:
    """Make (and remove) the output's temporary file, as :func:`write_output` will once
    the analysis is done: a directory writable by its mode that takes no new file (/proc
    for root, a read-only mount) failed only after the whole recording was read."""
    from llmtop.recording.paths import part_path

    tmp = part_path(out)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # (left by a report killed mid-write: it is replaced then)
        return
    except OSError as exc:
        raise write_failed(f"{out}: cannot create a file there ({exc.strerror or exc})",
                           exc) from None
    os.close(fd)
    tmp.unlink(missing_ok=True)


def write_output(out: Path, text: str) -> None:
    """``text`` to ``out``: a regular file under a temporary name renamed into place when
    complete (no half page); a device or FIFO (``/dev/stdout``, ``/dev/null``) in place
    (:func:`~llmtop.recording.paths.is_special`). A failed write is a one-line error."""
    from llmtop.recording.paths import is_special, part_path

    if is_special(out):
        try:
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise write_failed(f"{out}: cannot write: {exc.strerror or exc}", exc) from None
        return
    tmp = part_path(out)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_failed(f"{out}: cannot write: {exc.strerror or exc}", exc) from None
    except BaseException:  # Ctrl-C mid-write: no half-written page left beside the output
        tmp.unlink(missing_ok=True)
        raise


def main(args: argparse.Namespace) -> int:
    with term_as_exit():  # (SIGTERM, as Ctrl-C: no copy of a pipe, no .part file left)
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.progress import stderr_progress
    from llmtop.recording.reader import read_header
    from llmtop.recording.report.analyse import analyse
    from llmtop.recording.spool import STDIN, display_name, rereadable

    slo = slo_from_args(args)
    if args.slowest < 0:
        raise UsageError(f"--slowest must be 0 or more, got {args.slowest}")
    if args.output is not None and not args.output.strip():  # (an unset shell variable)
        raise UsageError(f"-o '{args.output}' is empty: give a file name, or leave -o out "
                         "for standard output")
    check_recording_args({"FILE": args.file, "FILE2": args.file2})
    out = check_output(args.output) if args.output else None
    files = [args.file] + ([args.file2] if args.file2 is not None else [])
    series: tuple[int, ...] = args.series or ()
    if len(series) > len(files):
        raise UsageError(f"--series {args.series[0]},{args.series[1]} names a series for each "
                         "of two recordings: give FILE2, or one N")
    by_file = [None if not series else series[min(i, len(series) - 1)]
               for i in range(len(files))]
    if out is not None:
        from llmtop.recording.parts import source_files
        from llmtop.recording.paths import refuse_input_as_output

        sources = [resolve_recording(x, n, "llmtop report", quiet=True)
                   for x, n in zip(files, by_file, strict=True) if x != STDIN]
        inputs = [f for src in sources for f in source_files(src)]
        refuse_stem_as_output([out], sources)
        try:
            refuse_input_as_output([out], inputs)
        except RecordingError as exc:
            raise UsageError(str(exc)) from None
    if args.format == "html" and out is None and sys.stdout.isatty():
        raise UsageError("--format html writes a page: give -o FILE (or redirect stdout)")
    reports = []
    try:
        with contextlib.ExitStack() as stack:  # `-`, a pipe: read from a copy (spool.py)
            copies = [stack.enter_context(rereadable(f, None if args.quiet else "llmtop report"))
                      for f in files]
            # (a stem: its parts, the notes on them said once, before the long reads)
            paths = [resolve_recording(p, n if p == f else None, "llmtop report",
                                       quiet=args.quiet)
                     for f, p, n in zip(files, copies, by_file, strict=True)]
            for p in paths[1:]:  # a bad FILE2 is told before FILE is analysed, not minutes after
                read_header(p)
            for f, c, p in zip(files, copies, paths, strict=True):
                name = Path(display_name(f)).name
                progress = None if args.quiet else stderr_progress(f"llmtop report: {name}")
                report = analyse(p, slo=slo or None, progress=progress,
                                 slowest=args.slowest)
                if c != f:
                    report["source"].update(file=name, path=display_name(f))
                reports.append(report)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except (KeyboardInterrupt, SystemExit):  # (exit 130/143, with a word, as export says)
        print("llmtop report: interrupted; no report written", file=sys.stderr, flush=True)
        raise

    if args.format == "json":
        from llmtop.recording.report.compare import comparison
        from llmtop.recording.report.jsonfmt import render_json

        doc = reports[0] if len(reports) == 1 else {
            **comparison(reports[0], reports[1]), "reports": reports}
        text = render_json(doc)
    elif args.format == "html":
        try:
            from llmtop.recording.report.html import render_compare_html, render_html
        except ImportError:
            raise UsageError("--format html needs matplotlib: pip install 'llmtop[report]'") \
                from None
        text = (render_html(reports[0]) if len(reports) == 1
                else render_compare_html(reports[0], reports[1]))
    else:
        from llmtop.recording.report.compare import render_compare_text
        from llmtop.recording.report.text import render_text

        text = (render_text(reports[0]) if len(reports) == 1
                else render_compare_text(reports[0], reports[1]))

    if out is not None:
        write_output(out, text)
        if not args.quiet:
            print(f"llmtop report: wrote {out}", file=sys.stderr, flush=True)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
