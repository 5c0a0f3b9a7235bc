"""``llmtop bench``: load generation and SLO capacity search."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from llmtop.cli.common import (
    RuntimeFailure,
    UsageError,
    add_slo_spec_argument,
    config_arg,
    slo_from_args,
)
from llmtop.config import HEADER_NAME
from llmtop.textsafe import printable

NAME = "bench"
HELP = "load generator: find the largest concurrency (or rate) that meets the SLOs"
DESCRIPTION = """\
Drive an OpenAI-compatible endpoint (directly, or through an llmtop proxy) and report,
per load level, TTFT / ITL / TPOT / E2E percentiles, system and per-request tokens/s,
goodput and SLO attainment — then the largest level that still meets the SLOs.

Closed loop (--concurrency) keeps N requests open. Open loop (--rate) sends Poisson
arrivals (or --constant) at their scheduled times and measures from those times, so a
slow server cannot hide its stalls (no coordinated omission); a level whose own sending
fell behind its schedule (P99 over 10 ms late: a rate beyond this client) says so, as
that delay is then in every figure. --search sweeps then
bisects to the largest level whose SLO attainment holds the target (rates: to within 5 %
of the failing rate, or 0.25 req/s). The SLOs come from
--slo (e.g. --slo ttft=0.5,itl_p95=0.05,target=0.95) or the --slo-* flags, which mean
the same; their defaults are the config's (--config, LLMTOP_SLO_*).

Token counts come from the engine's usage (requested with stream_options), not from
counting chunks; a stream that breaks before its usage is estimated as an llmtop proxy
estimates it. Only targets on this machine (localhost, loopback, or an IP address of one of
its own interfaces) are allowed unless --allow-remote: a load generator pointed at someone's
production by mistake is an incident.

Through an llmtop proxy, bench and the proxy (its snapshot, /metrics, recording) count the
same requests, errors and tokens, and judge SLOs by the same rules, but measure at
different sockets: bench's TTFT and E2E include the hop to the proxy and back (ms on
loopback), so they are a little above the proxy's and a request near the TTFT objective may
meet it at the proxy only. A request bench's --timeout ends is a timeout to bench (judged,
failed) and a client cancellation to the proxy (judged only if it had already missed an
objective). bench leaves out its warm-up requests (--warmup) and, with --duration in
closed loop, those that end after the level's deadline; the proxy counts them. bench's
rates are over each level's measured duration, the proxy's over its window: compare counts.

Failed requests are counted by kind (connection refused, HTTP 500, timeout …); a worker
whose requests keep failing backs off, and a level where nothing succeeds gives up early.
A request that finds its kept-alive connection already closed by the server (llama.cpp's
server closes idle ones) before any answer is resent once on a new connection, and
counted and timed as one request from the resend.
Exit status: 0 done; 1 no request succeeded, the target stopped answering mid-run, or
the --record file could not be written;
2 bad usage; 130 interrupted by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (the ssh session
closed; not under nohup): the finished levels are still printed and recorded.

examples:
  llmtop bench http://127.0.0.1:8000 --concurrency 1,2,4,8 --duration 30
  llmtop bench http://127.0.0.1:8080 --search --slo ttft=0.5,itl_p95=0.05,target=0.9
  llmtop bench http://127.0.0.1:8000 --rate 1,2,5 --requests 200 --record run.jsonl
"""


MAX_CONCURRENCY = 4096
MAX_RATE = 10_000.0
MAX_REQUESTS = 1_000_000
MAX_SECONDS = 86_400.0
"""Upper bounds on flag values (a day for any time)."""
MIN_RATE = 0.001
"""The lowest ``--rate`` (a request every 1,000 s): 1e-300 made the first arrival's gap
overflow the load generator's clock (a traceback), and far below it no level sees a
request."""


def _list(value: str, kind: type[float] | type[int], what: str, top: float,
          least: float | None = None) -> list[float]:
    """The comma-separated levels, each more than 0 (at least ``least`` when given) and at
    most ``top``."""
    items = value.split(",")
    if any(not x.strip() for x in items):
        raise UsageError(f"{what} '{value}' has an empty item; e.g. 1,2,4")
    try:
        out = [float(kind(x)) for x in items]
    except ValueError:
        raise UsageError(f"{what} '{value}' must be a comma-separated list of "
                         f"{'whole ' if kind is int else ''}numbers") from None
    if any(not math.isfinite(x) or x <= 0 or x < (least or 0) or x > top for x in out):
        low = ("more than 0" if least is None else
               f"at least {least:g} (a request every {1 / least:,.0f} s)")
        raise UsageError(f"{what} '{value}': every value must be {low} and at most {top:,g}")
    twice = sorted({x for x in out if out.count(x) > 1})
    if twice:
        raise UsageError(f"{what} '{value}' lists {', '.join(f'{x:g}' for x in twice)} more "
                         "than once; each level runs once")
    return out


def _number(value: float | None, flag: str, *, low: float, high: float,
            low_ok: bool = False) -> None:
    """A usage error unless ``value`` is None or finite within (low, high] ([low, high] with
    ``low_ok``)."""
    if value is None:
        return
    above = value >= low if low_ok else value > low
    if not (math.isfinite(value) and above and value <= high):
        bound = "at least" if low_ok else "more than"
        raise UsageError(f"{flag} {value:g}: must be {bound} {low:g} and at most {high:,g}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="base URL of the endpoint (…/v1 is added)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", metavar="LIST",
                      help="closed-loop levels, e.g. 1,2,4,8, run in this order (in "
                           "ascending order with --search), each once; each 1 to "
                           f"{MAX_CONCURRENCY:,} (default: 1; with --search 1,2,4,8)")
    load.add_argument("--rate", metavar="LIST",
                      help="open-loop arrival rates in req/s, e.g. 1,2,5; each "
                           f"{MIN_RATE:g} to {MAX_RATE:,.0f} (default: closed loop)")
    p.add_argument("--search", action="store_true",
                   help="find the largest level meeting the SLOs (sweep, then bisect)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, metavar="N",
                      help=f"measured requests per level, 1 to {MAX_REQUESTS:,} "
                           "(default: run for --duration)")
    size.add_argument("--duration", type=float, metavar="S",
                      help="seconds per level (default: 30)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="seconds at the start of each level not counted: by --duration in "
                        "closed loop, the requests that finish in them; with --rate or "
                        "--requests, those that start in them (default: 10%% of the "
                        "duration, ≤ 5 s; 0 with --requests)")
    p.add_argument("--prompt-tokens", default="128", metavar="N|LO-HI",
                   help="prompt length in tokens (default: 128), approximate: the text is "
                        "made to be about this many tokens, and with --api chat the engine "
                        "adds its chat template (e.g. 64 arrived as 94 at llama.cpp); the "
                        "input tok/s figures and the recording use the engine's own counts "
                        "from its usage (a request answered without usage — refused, or "
                        "broken off before it — counts none, as at an llmtop proxy)")
    p.add_argument("--max-tokens", default="128", metavar="N|LO-HI",
                   help="output length in tokens (default: 128)")
    p.add_argument("--workload", metavar="FILE",
                   help='JSONL of {"prompt_tokens": N | "prompt": "...", "max_tokens": M} '
                        "(default: synthetic prompts of --prompt-tokens)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="workload and arrival seed (default: 0)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat",
                   help="chat: /v1/chat/completions; completions: /v1/completions "
                        "(default: chat)")
    p.add_argument("--model", default="default", metavar="NAME",
                   help="model name to send (default: 'default')")
    p.add_argument("--api-key", metavar="KEY",
                   help="sent as 'Authorization: Bearer KEY', for an endpoint that wants one "
                        f"(default: ${API_KEY_ENV}; prefer the variable — a command line is "
                        "visible to every user of the machine in ps); never recorded")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an extra request header, e.g. 'X-Tenant: a' (repeatable; default: "
                        "none); never recorded")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="don't send ignore_eos (for servers that reject it)")
    p.add_argument("--constant", action="store_true",
                   help="constant arrivals with --rate (default: Poisson)")
    add_slo_spec_argument(p, "(default: each --slo-* flag's default)")
    p.add_argument("--slo-ttft", type=float, metavar="S",
                   help="TTFT SLO in seconds (default: 0.5, or the config's)")
    p.add_argument("--slo-itl-p95", type=float, metavar="S",
                   help="per-request ITL p95 SLO in seconds (default: 0.05, or the config's)")
    p.add_argument("--slo-tpot", type=float, metavar="S",
                   help="TPOT SLO in seconds (default: none, or the config's)")
    p.add_argument("--slo-e2e", type=float, metavar="S",
                   help="end-to-end SLO in seconds (default: none, or the config's)")
    p.add_argument("--slo-target", type=float, metavar="F",
                   help="attainment target, a share in (0, 1] (default: 0.95, or the "
                        "config's)")
    p.add_argument("--max-level", type=float, default=None, metavar="N",
                   help="highest level to run; --search never goes above it (default: 1024 "
                        "with --search)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="per-request timeout (default: 600); connecting has a limit of "
                        "its own, the config's timeouts.connect_s (default: 10; "
                        "LLMTOP_TIMEOUTS_CONNECT_S)")
    p.add_argument("--max-duration", type=float, default=3600.0, metavar="S",
                   help="refuse plans longer than this in total (default: 3600)")
    p.add_argument("--admin", metavar="URL",
                   help="an llmtop admin API to read GPU readings from at each level, "
                        "with the token in $LLMTOP_ADMIN_TOKEN if it wants one (default: "
                        "local NVML, if any)")
    p.add_argument("--record", metavar="FILE",
                   help="write a recording, for llmtop report (default: none)")
    p.add_argument("--json", action="store_true",
                   help="print the results as JSON (also when nothing succeeded: the levels "
                        "run, their failures by kind and why bench stopped; exit status 1)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a target that is not on this machine (localhost, loopback or one "
                        "of its own IP addresses)")
    p.add_argument("--config", metavar="FILE",
                   help="TOML config; its SLOs (and LLMTOP_SLO_* variables) are the defaults "
                        "of the --slo flags (default: none)")


API_KEY_ENV = "LLMTOP_BENCH_API_KEY"
"""The variable ``--api-key`` defaults to."""

_SET_BY_BENCH = frozenset(["host", "content-length", "transfer-encoding", "connection",
                           "keep-alive", "upgrade", "te", "trailer", "proxy-connection"])


def request_headers(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """The extra headers of every request: ``--header`` lines, then the API key's
    ``Authorization`` (UsageError for a malformed line or a header the client must set)."""
    headers: dict[str, str] = {}
    for line in args.header:
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not HEADER_NAME.fullmatch(name):
            raise UsageError(f"--header '{printable(line)}' must be 'NAME: VALUE', e.g. "
                             "'X-Tenant: a'")
        if any(c in value for c in "\r\n\0"):
            raise UsageError(f"--header {name}: the value may not hold a line break")
        if name.lower() in _SET_BY_BENCH:
            raise UsageError(f"--header {name}: set by the HTTP client itself, not by hand")
        headers[name] = value
    key = args.api_key if args.api_key is not None else env.get(API_KEY_ENV)
    if key:
        if any(c in key for c in "\r\n\0") or key != key.strip():
            raise UsageError("--api-key: the key may not hold spaces at its ends or line "
                             "breaks")
        if any(k.lower() == "authorization" for k in headers):
            raise UsageError("--api-key and --header Authorization: give one of them")
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _levels(args: argparse.Namespace) -> tuple[Literal["concurrency", "rate"], list[float],
                                                float]:
    """The mode, the levels to start with and the highest level allowed."""
    rate = args.rate is not None
    top = MAX_RATE if rate else float(MAX_CONCURRENCY)
    _number(args.max_level, "--max-level", low=1 if not rate else 0, high=top, low_ok=not rate)
    max_level = args.max_level if args.max_level is not None else min(1024.0, top)
    if rate:
        levels = _list(args.rate, float, "--rate", MAX_RATE, MIN_RATE)
    elif args.concurrency is not None:
        levels = _list(args.concurrency, int, "--concurrency", MAX_CONCURRENCY)
    else:
        default = [1.0, 2.0, 4.0, 8.0] if args.search else [1.0]
        return "concurrency", [x for x in default if x <= max_level], max_level
    flag = "--rate" if rate else "--concurrency"
    if args.search:  # a sweep goes up: out of order, it would run levels again
        levels = sorted(levels)
    if (args.search or args.max_level is not None) and max(levels) > max_level:
        given = "" if args.max_level is not None else " (the default with --search)"
        raise UsageError(f"{flag} {max(levels):g} is above --max-level {max_level:g}{given}")
    return ("rate" if rate else "concurrency"), levels, max_level


def main(args: argparse.Namespace) -> int:
    from llmtop.bench.runner import BenchPlan, run_plan
    from llmtop.bench.workload import Workload, WorkloadError, load_entries, parse_length
    from llmtop.config import (
        ConfigError,
        check_zone,
        has_control_char,
        is_this_machine,
        load_config,
        unknown_env,
    )

    try:
        u = urlsplit(args.url)
        _ = u.port  # a ValueError for a port that is not 0 to 65,535
    except ValueError as exc:
        raise UsageError(f"URL '{args.url}' is not a valid URL: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"URL '{args.url}' must be an http:// or https:// URL")
    try:
        check_zone(u.netloc)
    except ConfigError as exc:
        raise UsageError(f"URL '{args.url}': {exc}") from None
    if u.username is not None or u.password is not None:
        raise UsageError("URL must not contain user:password@ (it would be written to the "
                         "recording); give the key with LLMTOP_BENCH_API_KEY or --header")
    token = os.environ.get("LLMTOP_ADMIN_TOKEN", "")
    if args.admin is not None and has_control_char(token):  # (as attach): never sent
        raise UsageError("LLMTOP_ADMIN_TOKEN has a control character (a line end from a "
                         "token file?): no proxy could receive it; remove it")
    admin_headers = {"Authorization": f"Bearer {token}"} if token and args.admin else {}
    admin = _admin(args.admin, admin_headers) if args.admin is not None else None
    if not is_this_machine(u.hostname) and not args.allow_remote:
        raise UsageError(
            f"{u.hostname} is not this machine; pass --allow-remote if you really mean to "
            "send load there"
        )
    if not args.model.strip():  # (an unset shell variable: "model": "" in every request)
        raise UsageError(f"--model '{args.model}' is empty: give the model's name, or leave "
                         "--model out to send 'default'")
    slo = slo_from_args(args)
    cfg = load_config(config_arg(args), os.environ, {f"slo.{k}": v for k, v in slo.items()},
                      slo_only=True)  # (the proxy's settings in a run config are not bench's)
    for line in unknown_env(os.environ):  # (a misspelt LLMTOP_SLO_* was ignored unsaid)
        print(f"llmtop bench: warning: {line}", file=sys.stderr, flush=True)
    mode, levels, max_level = _levels(args)
    if args.requests is not None and not 1 <= args.requests <= MAX_REQUESTS:
        raise UsageError(f"--requests {args.requests}: must be 1 to {MAX_REQUESTS:,}")
    _number(args.duration, "--duration", low=0, high=MAX_SECONDS)
    _number(args.warmup, "--warmup", low=0, high=MAX_SECONDS, low_ok=True)
    _number(args.timeout, "--timeout", low=0, high=MAX_SECONDS)
    _number(args.max_duration, "--max-duration", low=0, high=7 * MAX_SECONDS)
    duration = args.duration
    if duration is None and args.requests is None:
        duration = 30.0
    warmup = args.warmup
    if warmup is None:
        warmup = min(5.0, 0.1 * duration) if duration is not None else 0.0
    steps = len(levels)
    if args.search:  # (the sweep's doublings and the longest bisection after a failure)
        from llmtop.bench.search import most_levels

        steps = most_levels(levels, integer=mode == "concurrency", max_level=max_level)
    if duration is not None:
        if steps * (duration + warmup) > args.max_duration:
            raise UsageError(
                f"this plan could run {steps * (duration + warmup):.0f} s, over --max-duration "
                f"{args.max_duration:.0f} s; shorten --duration or raise --max-duration"
            )
    elif mode == "rate":  # N requests at R/s: their arrivals alone take N / R seconds
        def level_s(rate: float) -> float:
            return float(warmup + args.requests / rate)

        if args.search:  # (a bisection goes below the lowest level given: slower ones)
            from llmtop.bench.search import most_seconds

            could = most_seconds(levels, max_level=max_level, level_s=level_s)
        else:
            could = sum(level_s(rate) for rate in levels)
        if could > args.max_duration:
            raise UsageError(
                f"this plan could run {could:.0f} s, over --max-duration "
                f"{args.max_duration:.0f} s; lower --requests, raise --rate or raise "
                "--max-duration")
    _open_files(int(max(levels + ([max_level] if args.search else [])))
                if mode == "concurrency" else None)
    try:
        workload = Workload(
            prompt_tokens=parse_length(args.prompt_tokens, "--prompt-tokens"),
            max_tokens=parse_length(args.max_tokens, "--max-tokens"),
            entries=load_entries(args.workload) if args.workload is not None else None,
            seed=args.seed,
        )
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    if args.record is not None:
        from llmtop.recording.errors import RecordingError
        from llmtop.recording.writer import check_recording_path

        try:
            check_recording_path(args.record)
        except RecordingError as exc:
            raise UsageError(f"--record: {exc}") from None
    plan = BenchPlan(
        url=args.url, mode=mode, levels=levels, search=args.search, duration_s=duration,
        requests=args.requests, warmup_s=warmup, workload=workload, api=args.api,
        model=args.model, ignore_eos=not args.no_ignore_eos, poisson=not args.constant,
        seed=args.seed, max_level=max_level, timeout_s=args.timeout,
        admin_url=admin, admin_headers=admin_headers, record=args.record, as_json=args.json,
        headers=request_headers(args, os.environ),
    )
    from llmtop.recording.errors import RecordingBusy, RecordingError

    try:
        return run_plan(plan, cfg)
    except RecordingBusy as exc:  # out of file descriptors: not the path's fault
        raise RuntimeFailure(f"--record: {exc}") from None
    except RecordingError as exc:  # the file could not be opened, before any request: a
        # path the check above cannot judge (root may write to /proc, where no file is made)
        raise UsageError(f"--record: {exc}") from None


def _admin(url: str, headers: dict[str, str]) -> str:
    """``--admin`` normalised, once an llmtop admin API answered there (else a usage error:
    a mistyped URL used to give a run without GPU readings, and no word why)."""
    import asyncio

    from llmtop.bench.runner import admin_problem
    from llmtop.tui.source import normalize_admin_url

    try:
        admin = normalize_admin_url(url)
    except ValueError as exc:
        raise UsageError(f"--admin: {exc}") from None
    if (problem := asyncio.run(admin_problem(admin, headers))) is not None:
        raise UsageError(f"--admin: {problem}")
    return admin


OPEN_LOOP_FILES = 65536
"""The open-file limit an open-loop run (``--rate``) asks for: how many requests are open
at once is the target's doing, not bench's (a slow target piles them up)."""


def _open_files(concurrency: int | None) -> None:
    """Raise the open-file limit to what ``concurrency`` connections need, or say why not;
    for an open loop (``None``), as far as the hard limit allows (a level that still runs
    out is stopped by the runner, which says so)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if concurrency is None:
        want = OPEN_LOOP_FILES if hard == resource.RLIM_INFINITY else min(OPEN_LOOP_FILES,
                                                                          hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return
    need = concurrency + 64
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise UsageError(f"concurrency {concurrency} needs {need} open files; this process may "
                     f"have {hard} (ulimit -n)")
