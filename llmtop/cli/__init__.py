"""The thin command line: each ``llmtop/cli/<command>.py`` declares its arguments and calls
into the library. Modules are discovered, so a new command is a new file.

A command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``main(args) -> int``. Heavy imports belong inside ``main`` so ``--help`` stays fast.
Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad config (one line, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from llmtop import __version__, pipe_out
from llmtop.cli.common import RuntimeFailure, UsageError
from llmtop.config import ConfigError
from llmtop.parent_watch import watch_parent
from llmtop.textsafe import printable

ORDER = ("run", "attach", "replay", "report", "export", "bench", "sim", "demo")


def _command_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmtop",
        description="top for LLM serving traffic: a streaming reverse proxy that measures "
        "TTFT, inter-token latency, tokens/s, queueing and goodput as clients see them.",
    )
    parser.add_argument("--version", action="version", version=f"llmtop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        extra = {"help": mod.HELP} if mod.HELP else {}  # no HELP: an internal command
        p = sub.add_parser(
            mod.NAME,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **extra,
        )
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main, _parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw and not raw[0].startswith("-"):
        modules = _command_modules()
        if raw[0] not in {m.NAME for m in modules}:  # argparse would list internal ones
            public = ", ".join(m.NAME for m in modules if m.HELP)
            parser.error(f"unknown command '{raw[0]}' (choose from {public})")
    args, unknown = parser.parse_known_args(raw)
    if unknown:  # said by the command's own parser, with its usage, not llmtop's
        owner: argparse.ArgumentParser = getattr(args, "_parser", parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    args._argv = raw
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    watch_parent()  # started by another llmtop process: stop if it dies
    try:
        return int(args._main(args))
    except (ConfigError, UsageError) as exc:
        # printable: a value the user typed with a newline or ESC in it (quoted back in the
        # message) neither splits the one line nor drives the terminal
        print(f"llmtop {args.command}: error: {printable(str(exc))}", file=sys.stderr,
              flush=True)
        return 2
    except RuntimeFailure as exc:
        print(f"llmtop {args.command}: error: {printable(str(exc))}", file=sys.stderr,
              flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `llmtop report FILE | head -1`: the reader left. Stop quietly, as cat does (the
        # status of a SIGPIPE death, 141), instead of a traceback and 1; the stream is
        # pointed at /dev/null so Python's flush at exit does not raise it again.
        pipe_out.silence(sys.stdout)
        pipe_out.silence(sys.stderr)
        return 141
