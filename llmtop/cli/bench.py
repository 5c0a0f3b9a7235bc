"""``llmtop bench``: load generation and SLO capacity search."""

from __future__ import annotations

import argparse
import os
from typing import Literal
from urllib.parse import urlsplit

from llmtop.cli.common import UsageError

NAME = "bench"
HELP = "load generator: find the largest concurrency (or rate) that meets the SLOs"
DESCRIPTION = """\
Drive an OpenAI-compatible endpoint (directly, or through an llmtop proxy) and report,
per load level, TTFT / ITL / TPOT / E2E percentiles, system and per-request tokens/s,
goodput and SLO attainment — then the largest level that still meets the SLOs.

Closed loop (--concurrency) keeps N requests open. Open loop (--rate) sends Poisson
arrivals (or --constant) at their scheduled times and measures from those times, so a
slow server cannot hide its stalls (no coordinated omission). --search sweeps then
bisects to the largest level whose SLO attainment holds --slo-target.

Token counts come from the engine's usage (requested with stream_options), not from
counting chunks. Only loopback targets are allowed unless --allow-remote: a load
generator pointed at someone's production by mistake is an incident.

examples:
  llmtop bench http://127.0.0.1:8000 --concurrency 1,2,4,8 --duration 30
  llmtop bench http://127.0.0.1:8080 --search --slo-ttft 0.5 --slo-itl-p95 0.05
  llmtop bench http://127.0.0.1:8000 --rate 1,2,5 --requests 200 --record run.jsonl
"""


def _list(value: str, kind: type[float] | type[int], what: str) -> list[float]:
    try:
        out = [float(kind(x)) for x in value.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} '{value}' must be a comma-separated list of numbers") from None
    if not out or any(x <= 0 for x in out):
        raise UsageError(f"{what} '{value}': every value must be positive")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="base URL of the endpoint (…/v1 is added)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", metavar="LIST", help="closed-loop levels, e.g. 1,2,4,8")
    load.add_argument("--rate", metavar="LIST", help="open-loop arrival rates (req/s), e.g. 1,2,5")
    p.add_argument("--search", action="store_true",
                   help="find the largest level meeting the SLOs (sweep, then bisect)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, metavar="N", help="measured requests per level")
    size.add_argument("--duration", type=float, metavar="S", help="seconds per level (30)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="seconds per level not counted (default: 10%% of the duration, ≤ 5 s)")
    p.add_argument("--prompt-tokens", default="128", metavar="N|LO-HI",
                   help="prompt length in tokens (128)")
    p.add_argument("--max-tokens", default="128", metavar="N|LO-HI",
                   help="output length in tokens (128)")
    p.add_argument("--workload", metavar="FILE",
                   help='JSONL of {"prompt_tokens": N | "prompt": "...", "max_tokens": M}')
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed (0)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--model", default="default", help="model name to send ('default')")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="don't send ignore_eos (for servers that reject it)")
    p.add_argument("--constant", action="store_true", help="constant arrivals, not Poisson")
    p.add_argument("--slo-ttft", type=float, metavar="S", help="TTFT SLO in seconds (0.5)")
    p.add_argument("--slo-itl-p95", type=float, metavar="S", help="per-request ITL p95 SLO (0.05)")
    p.add_argument("--slo-tpot", type=float, metavar="S", help="TPOT SLO in seconds")
    p.add_argument("--slo-e2e", type=float, metavar="S", help="end-to-end SLO in seconds")
    p.add_argument("--slo-target", type=float, metavar="F", help="attainment target (0.95)")
    p.add_argument("--max-level", type=float, default=1024, help="search ceiling (1024)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="per-request timeout (600)")
    p.add_argument("--max-duration", type=float, default=3600.0, metavar="S",
                   help="refuse plans longer than this in total (3600)")
    p.add_argument("--admin", metavar="URL",
                   help="an llmtop admin API to read GPU readings from at each level")
    p.add_argument("--record", metavar="FILE", help="write a recording (for llmtop report)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a target that is not on this machine (loopback)")
    p.add_argument("--config", metavar="FILE", help="TOML config (SLOs are read from it)")


def main(args: argparse.Namespace) -> int:
    from llmtop.bench.runner import BenchPlan, run_plan
    from llmtop.bench.workload import Workload, WorkloadError, load_entries, parse_length
    from llmtop.config import is_loopback, load_config

    u = urlsplit(args.url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"URL '{args.url}' must be an http:// or https:// URL")
    if not is_loopback(u.hostname) and not args.allow_remote:
        raise UsageError(
            f"{u.hostname} is not this machine; pass --allow-remote if you really mean to "
            "send load there"
        )
    cfg = load_config(args.config, os.environ, {
        "slo.ttft_s": args.slo_ttft, "slo.itl_p95_s": args.slo_itl_p95,
        "slo.tpot_s": args.slo_tpot, "slo.e2e_s": args.slo_e2e,
        "slo.target": args.slo_target,
    })
    mode: Literal["concurrency", "rate"]
    if args.rate:
        mode, levels = "rate", _list(args.rate, float, "--rate")
    elif args.concurrency:
        mode, levels = "concurrency", _list(args.concurrency, int, "--concurrency")
    else:
        mode, levels = "concurrency", ([1.0, 2.0, 4.0, 8.0] if args.search else [1.0])
    if args.requests is not None and args.requests < 1:
        raise UsageError("--requests must be at least 1")
    duration = args.duration
    if duration is None and args.requests is None:
        duration = 30.0
    if duration is not None and duration <= 0:
        raise UsageError("--duration must be positive")
    warmup = args.warmup
    if warmup is None:
        warmup = min(5.0, 0.1 * duration) if duration is not None else 0.0
    if warmup < 0:
        raise UsageError("--warmup must not be negative")
    if duration is not None:
        steps = len(levels) + (12 if args.search else 0)
        if steps * (duration + warmup) > args.max_duration:
            raise UsageError(
                f"this plan could run {steps * (duration + warmup):.0f} s, over --max-duration "
                f"{args.max_duration:.0f} s; shorten --duration or raise --max-duration"
            )
    try:
        workload = Workload(
            prompt_tokens=parse_length(args.prompt_tokens, "--prompt-tokens"),
            max_tokens=parse_length(args.max_tokens, "--max-tokens"),
            entries=load_entries(args.workload) if args.workload else None,
            seed=args.seed,
        )
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    if args.record and os.path.exists(args.record):
        raise UsageError(f"--record: {args.record} exists; choose a new file")
    plan = BenchPlan(
        url=args.url, mode=mode, levels=levels, search=args.search, duration_s=duration,
        requests=args.requests, warmup_s=warmup, workload=workload, api=args.api,
        model=args.model, ignore_eos=not args.no_ignore_eos, poisson=not args.constant,
        seed=args.seed, max_level=args.max_level, timeout_s=args.timeout,
        admin_url=args.admin, record=args.record, as_json=args.json,
    )
    return run_plan(plan, cfg)
