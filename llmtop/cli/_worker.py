"""Internal: one proxy process of ``llmtop run --workers N`` (started by the coordinator)."""

from __future__ import annotations

import argparse
import sys

from llmtop.cli.common import UsageError

NAME = "_worker"
HELP = ""  # internal: not listed in --help


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--ingest", required=True)
    p.add_argument("--config")
    p.add_argument("--fleet", help="the coordinator's table of open requests per worker "
                   "(a path; /dev/fd/N for the descriptor it passed)")


def main(args: argparse.Namespace) -> int:
    import asyncio
    import os

    from llmtop.cli.run import install_uvloop
    from llmtop.config import load_config
    from llmtop.server import StartupError, serve_worker

    token = sys.stdin.readline().strip()
    if not token:
        raise UsageError("an internal command: started by `llmtop run --workers N`")
    cfg = load_config(args.config, os.environ, {
        "upstream": args.upstream, "listen": args.listen, "workers": 1,
    })
    install_uvloop()
    try:
        asyncio.run(serve_worker(cfg, args.index, args.ingest, token, args.fleet))
    except StartupError as exc:
        print(f"llmtop: worker {args.index} failed: {exc}", flush=True)
        return 2
    return 0
