"""llmtop bench's flags: non-finite, negative and absurd values are one-line usage errors,
--max-level is honoured, --help documents every flag; --requests N measures exactly N; a
verdict with no passing level says what failed at the lowest one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import pytest

from llmtop.bench.client import BenchClient
from llmtop.bench.loadgen import run_closed
from llmtop.bench.output import verdict
from llmtop.bench.search import SearchResult
from llmtop.bench.summary import summarize
from llmtop.bench.workload import Length, Workload
from llmtop.cli import build_parser, main
from llmtop.config import load_config
from llmtop.sim.server import running_sim

URL = "http://127.0.0.1:1"


@pytest.mark.parametrize("args", [
    ["--rate", "inf"], ["--rate", "nan", "--requests", "3"], ["--rate", "-1"],
    ["--rate", "100000"], ["--duration", "nan"], ["--duration", "inf"], ["--duration", "-2"],
    ["--warmup", "nan"], ["--warmup", "-1"], ["--timeout", "0"], ["--timeout", "inf"],
    ["--max-level", "0", "--search"], ["--max-level", "nan", "--search"],
    ["--max-level", "2", "--search", "--concurrency", "1,4"],
    ["--search", "--concurrency", "1,2048"],
    ["--concurrency", "1000000", "--requests", "3"], ["--concurrency", "1,,2"],
    ["--concurrency", "1,"], ["--concurrency", "0"], ["--concurrency", "1.5"],
    ["--requests", "0"], ["--requests", "100000000"], ["--slo-ttft", "nan"],
    ["--slo-e2e", "-1"], ["--slo-target", "nan"], ["--max-duration", "inf"],
    ["--prompt-tokens", "100000000"], ["--max-tokens", "1-9999999"],
])
def test_bad_values_are_one_line_usage_errors(args: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Each is refused before any request is sent (the target here is a closed port)."""
    code = main(["bench", URL, *args])
    err = capsys.readouterr().err
    assert code == 2, (args, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("llmtop bench: error: "), err


def bench_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["bench"]
    return parser


def test_help_documents_every_flag_and_its_default() -> None:
    """Every option has help text; every option that takes a value names its default (or
    says there is none), and its bounds where it has them; no metavar is a bare dest."""
    p = bench_parser()
    text = p.format_help()
    assert "--max-level N" in text and "MAX_LEVEL" not in text
    for action in p._actions:
        if not action.option_strings or action.option_strings == ["-h", "--help"]:
            continue
        name = action.option_strings[-1]
        assert action.help, f"{name} has no help"
        if action.nargs == 0:  # a switch
            continue
        assert "default" in action.help, f"{name}: no default in help"
    assert "chat: /v1/chat/completions" in text
    assert "4,096" in text and "10,000" in text and "1,000,000" in text


async def test_max_level_is_honoured_by_the_search() -> None:
    """--search --max-level 3 runs 1, 2 and then 3 itself, never 4 or 8."""
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", sim.url, "--search", "--max-level", "3",
            "--requests", "3", "--max-tokens", "4", "--prompt-tokens", "8", "--slo-ttft", "5",
            "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0, 2.0, 3.0]
    assert data["best"] == 3.0


async def test_requests_n_measures_exactly_n_at_any_concurrency() -> None:
    """15 requests at concurrency 4: exactly 15 sent and measured (not 16)."""
    wl = Workload(prompt_tokens=Length(8, 8), max_tokens=Length(4, 4), seed=1)
    async with running_sim("tiny") as sim:
        run = await run_closed(BenchClient(sim.url), wl, 4, requests=15)
    assert run.sent == len(run.records) == 15
    assert all(r.outcome == "ok" for r in run.records)


async def test_verdict_with_no_passing_level_says_what_failed_at_the_lowest() -> None:
    """With a TTFT SLO no request can meet, the verdict names the objective, how many met
    it and the TTFT at the target percentile."""
    cfg = load_config(None, env={}, overrides={"slo.ttft_s": 0.001})
    wl = Workload(prompt_tokens=Length(8, 8), max_tokens=Length(4, 4), seed=1)
    async with running_sim("tiny") as sim:
        runs = [await run_closed(BenchClient(sim.url), wl, n, requests=4) for n in (2, 1)]
    steps = [summarize(r, cfg) for r in runs]
    text = verdict(SearchResult(steps, None, steps[1]), "concurrency", cfg)
    assert "none — even concurrency 1 misses TTFT ≤ 1 ms (met by 0% of requests; p95 " in text
    ttft_p95 = steps[1].slo_detail["ttft"]["at_target"]
    assert ttft_p95 is not None and f"p95 {ttft_p95 * 1000:.0f} ms" in text
