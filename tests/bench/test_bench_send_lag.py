"""Open loop measures every latency from the scheduled time, so a load generator that
falls behind its schedule (a busy client, a rate beyond one process) adds its own delay to
every figure, and reads as the target's. bench measured that delay nowhere: at --rate
10000 here (~900/s sendable) the table showed the client's lag as server latency. Each
open-loop level now carries how late its requests started (P99, max), and bench says so
when the P99 is over 10 ms."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web
from net_support import chat_engine

from llmtop.bench.client import BenchClient
from llmtop.bench.loadgen import run_closed, run_open
from llmtop.bench.output import LAG_WARN_S, error_lines, lag_text
from llmtop.bench.search import SearchResult
from llmtop.bench.summary import summarize
from llmtop.bench.workload import Length, Workload
from llmtop.config import load_config

DONE = (b"data: " + json.dumps({"id": "c", "choices": [
    {"index": 0, "delta": {"content": "a"}}]}).encode() + b"\n\ndata: [DONE]\n\n")


async def quick(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(DONE)
    await resp.write_eof()
    return resp


async def test_a_stalled_load_generator_is_measured_and_said() -> None:
    """The bench loop is blocked for 300 ms (as a busy client is) while 20/s arrivals are
    due: those scheduled in the stall start up to 300 ms late, and the level says so."""
    cfg = load_config(None, env={}, overrides={"slo.ttft_s": 10.0})
    loop = asyncio.get_running_loop()
    async with chat_engine(quick) as url:
        loop.call_later(0.2, time.sleep, 0.3)  # the generator's own stall
        run = await run_open(BenchClient(url), Workload(max_tokens=Length(1, 1)), 20.0,
                             duration_s=1.0, poisson=False)
    s = summarize(run, cfg)
    assert len(run.send_lags_ns) == s.requests == 20
    assert s.send_lag_max_s is not None and 0.2 <= s.send_lag_max_s < 1.0
    assert s.send_lag_p99_s is not None and s.send_lag_p99_s > LAG_WARN_S
    # the lag is in the latencies: the late requests' TTFT holds it
    assert max(r.ttft_s or 0.0 for r in run.records) >= 0.2
    said = "\n".join(error_lines(SearchResult([s], None, s), "rate"))
    assert "at rate 20/s: the load generator fell behind its schedule" in said
    assert f"{s.send_lag_max_s * 1000:.0f} ms at most" in said
    assert s.to_json_dict()["send_lag_p99_s"] == s.send_lag_p99_s


async def test_closed_loop_has_no_schedule_to_lag() -> None:
    cfg = load_config(None, env={}, overrides={"slo.ttft_s": 10.0})
    async with chat_engine(quick) as url:
        run = await run_closed(BenchClient(url), Workload(max_tokens=Length(1, 1)), 2,
                               requests=4)
    s = summarize(run, cfg)
    assert s.requests == 4 and run.send_lags_ns == []
    assert s.send_lag_p99_s is None and s.send_lag_max_s is None
    assert lag_text(s) is None


def test_the_warning_is_over_the_threshold_only() -> None:
    from llmtop.bench.summary import StepSummary

    def level(p99: float) -> StepSummary:
        return StepSummary(mode="rate", level=5.0, duration_s=1.0, requests=5, ok=5,
                           errors=0, timeouts=0, cancelled=0, rps=5.0, output_tps=5.0,
                           input_tps=5.0, goodput_rps=5.0, goodput_tps=5.0,
                           slo_attainment=1.0, per_request_tps_p50=None,
                           send_lag_p99_s=p99, send_lag_max_s=p99 * 2)

    assert lag_text(level(LAG_WARN_S)) is None
    shown = lag_text(level(0.05))
    assert shown is not None and "by 50 ms at P99, 100 ms at most" in shown
