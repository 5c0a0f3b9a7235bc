"""``llmtop sim``: run the simulated inference engine until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import textwrap

from llmtop.cli.common import UsageError
from llmtop.sim.profiles import OVERRIDABLE, PROFILES

NAME = "sim"
HELP = "the built-in simulated inference engine (OpenAI-compatible)"
DESCRIPTION = (
    textwrap.fill(
        "Run a simulated continuous-batching inference engine (vLLM-like: queueing, "
        "prefill stalls, memory-bound decode, KV-cache preemption) behind OpenAI (chat, "
        "completions, responses), Anthropic, Ollama, TGI and SGLang (native /generate) "
        "endpoints, with /metrics in vLLM's names and a simulated GPU at /sim/gpu.",
        width=88)
    + "\n\n"
    "profiles:\n"
    + "\n".join(f"  {p.name:<14} {p.model} on {p.gpu_name}, max_num_seqs={p.max_num_seqs}, "
                f"KV {p.kv_cache_tokens:,} tokens" for p in PROFILES.values())
    + "\n\noverridable keys (--set KEY=VALUE):\n"
    + textwrap.fill(", ".join(OVERRIDABLE), width=88, initial_indent="  ",
                    subsequent_indent="  ")
    + "\n\nper-request faults: header X-Sim-Fault: status:CODE (400-599) | "
    "disconnect-after:N |\n  malformed-after:N | stall:MS[@N] | slow-headers:MS "
    "(comma-separated; N: content\n  chunks sent, or tokens when not streamed; "
    "MS: wall-clock milliseconds)"
)

DEFAULT_LISTEN = "127.0.0.1:8000"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                   help=f"address to serve on; port 0 picks a free one (default {DEFAULT_LISTEN})")
    p.add_argument("--profile", metavar="NAME", default="tiny",
                   help=f"engine profile: {', '.join(PROFILES)} (default tiny)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="set",
                   help="override a profile parameter (repeatable), e.g. --set max_num_seqs=8")
    p.add_argument("--firehose", action="store_true",
                   help="no pacing and no limits: emit tokens as fast as possible")
    p.add_argument("--reuse-port", action="store_true",
                   help="share the port with other 'llmtop sim --reuse-port' processes "
                        "(SO_REUSEPORT): the kernel spreads connections across them, which "
                        "makes a faster simulated engine for load-testing llmtop itself; "
                        "each process has its own engine, /metrics and /sim/requests")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for ids, output lengths and text (default 0)")


def _split_listen(listen: str) -> tuple[str, int]:
    """``--listen`` read as ``llmtop run`` reads its addresses (``[::1]:8000`` for IPv6)."""
    from llmtop.config import ConfigError, parse_hostport

    try:
        return parse_hostport(listen, "--listen")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def main(args: argparse.Namespace) -> int:
    import asyncio

    from llmtop.sim.profiles import get_profile, parse_set_options
    from llmtop.sim.run import ListenError, serve_forever

    host, port = _split_listen(args.listen)
    try:
        profile = get_profile(args.profile, **parse_set_options(args.set))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    coro = serve_forever(profile, host, port, firehose=args.firehose, seed=args.seed,
                         reuse_port=args.reuse_port)
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
            asyncio.run(coro)
        else:
            uvloop.run(coro)
    except ListenError as exc:
        raise UsageError(f"cannot listen on {args.listen}: {exc}") from None
    return 0
