"""``llmtop attach``: the TUI for proxies that are already running."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from llmtop.cli.common import UsageError

if TYPE_CHECKING:
    from llmtop.tui.source import MergeFn

NAME = "attach"
HELP = "the live TUI for running proxies (one or many admin URLs)"
DESCRIPTION = """\
Show the live TUI for one or more running proxies, read from their admin APIs.
With several URLs the snapshots are merged exactly (histogram by histogram) and a
proxy that stops answering is named in the header while the others keep showing.

  llmtop run --upstream http://127.0.0.1:8000 --headless &
  llmtop attach http://127.0.0.1:8081
  LLMTOP_ADMIN_TOKEN=... llmtop attach 10.0.0.5:8081 10.0.0.6:8081
"""

WINDOW_CHOICES = {"10": 10, "60": 60, "300": 300, "all": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("urls", nargs="+", metavar="ADMIN_URL",
                   help="admin address of a proxy: http://HOST:PORT or HOST:PORT")
    p.add_argument("--token", action="append", metavar="T",
                   help="admin token (needed when the admin API is not on loopback; "
                        "default: $LLMTOP_ADMIN_TOKEN); once for every URL, or once per "
                        "URL in the order of the URLs (an empty one for a proxy without)")
    p.add_argument("--refresh-hz", type=float, default=4.0, metavar="HZ",
                   help="screen refreshes per second (default 4)")
    p.add_argument("--window", default="60", choices=tuple(WINDOW_CHOICES),
                   help="initial window in seconds, or all (default 60; w cycles it)")


def fleet_merge() -> MergeFn:
    """The merge of several proxies' snapshots for attach: each running proxy counted once,
    even when two of the addresses reach the same one (``localhost`` and ``127.0.0.1``, a
    name and its IP), with a warning that says so."""
    from llmtop.tui.source import load_merge

    load_merge()  # MergeUnavailable (a ValueError) in a build without the merge module
    from llmtop.metrics.merge import merge_snapshots

    def once_per_proxy(snaps: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_snapshots(snaps, once_per_proxy=True)

    return once_per_proxy


def main(args: argparse.Namespace) -> int:
    if not 0 < args.refresh_hz <= 60:
        raise UsageError(f"--refresh-hz {args.refresh_hz:g} must be in (0, 60]")
    from llmtop.tui.source import SHARED_SNAPSHOT_AGE_S, AdminSource

    try:
        tokens = args.token or [os.environ.get("LLMTOP_ADMIN_TOKEN", "")]
        source = AdminSource(args.urls, token=tokens, max_age_s=SHARED_SNAPSHOT_AGE_S,
                             merge=fleet_merge() if len(args.urls) > 1 else None)
    except ValueError as exc:  # a bad URL, or several without a merge function
        raise UsageError(str(exc)) from None
    twice = sorted({u for u in source.urls if source.urls.count(u) > 1})
    if twice:  # its figures would count twice
        raise UsageError(f"ADMIN_URL {twice[0]} is given more than once")
    if not sys.stdout.isatty():
        raise UsageError("the TUI needs a terminal; without one, read the figures from "
                         "ADMIN/llmtop/v1/snapshot or ADMIN/metrics")
    from llmtop.tui import run_tui

    return run_tui(source, refresh_hz=args.refresh_hz, window_s=WINDOW_CHOICES[args.window],
                   title="llmtop attach")
