"""llmtop bench against targets that fail: a closed port, a server that answers 500, one
that fails now and then, and one that goes away mid-run. Failures back off and are counted
by kind, a run where nothing succeeds ends with one error line (exit 1), a failed request's
prompt is not counted as input, and a level with some errors still runs as before."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from llmtop.bench.client import BenchClient
from llmtop.bench.loadgen import FailureWatch, backoff_s, run_closed
from llmtop.bench.summary import summarize
from llmtop.bench.workload import Length, Workload
from llmtop.config import load_config

SSE_OK = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
          b"data: [DONE]\n\n")


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Upstream:
    """An OpenAI-style upstream: request n (from 1) fails with HTTP 500 when ``fail(n)``;
    after ``serve_ok`` successful answers it stops listening (the proxy died)."""

    def __init__(self, fail_every: int = 0, serve_ok: int | None = None) -> None:
        self.fail_every = fail_every
        self.serve_ok = serve_ok
        self.n = 0
        self.ok = 0
        self.site: web.TCPSite | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.n += 1
        if self.fail_every and self.n % self.fail_every == 0:
            return web.json_response({"error": {"message": "engine overloaded"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(SSE_OK)
        await resp.write_eof()
        self.ok += 1
        if self.serve_ok is not None and self.ok >= self.serve_ok and self.site is not None:
            server = self.site._server
            if server is not None:
                server.close()  # stop listening: new connections are refused
        return resp


@asynccontextmanager
async def serving(up: Upstream) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", up.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    up.site = web.TCPSite(runner, "127.0.0.1", 0)
    await up.site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def bench(*args: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - t0


def workload() -> Workload:
    return Workload(prompt_tokens=Length(16, 16), max_tokens=Length(4, 4), seed=1)


def test_backoff_grows_only_while_requests_keep_failing() -> None:
    assert backoff_s(0) == backoff_s(1) == 0.0
    assert 0 < backoff_s(2) < backoff_s(3) < backoff_s(4) <= backoff_s(30) == 1.0


async def test_a_closed_port_backs_off_gives_up_and_counts_no_input() -> None:
    """Against a closed port, 2 workers for (up to) 20 s: a handful of requests, not a tight
    loop of thousands; the level gives up early; every failure is a 'connection refused';
    no input tokens are counted for requests that never reached a server."""
    client = BenchClient(f"http://127.0.0.1:{closed_port()}")
    t0 = time.monotonic()
    run = await run_closed(client, workload(), 2, duration_s=20.0,
                           watch=FailureWatch(failures=5, after_s=0.5))
    took = time.monotonic() - t0
    assert run.gave_up and took < 10, took
    assert 5 <= run.sent <= 30, run.sent
    s = summarize(run, load_config(None, env={}, overrides={}))
    assert s.requests == s.errors > 0 and s.ok == 0 and s.gave_up
    assert s.error_kinds == {"connection refused": s.errors}
    assert s.input_tps == 0.0 and s.output_tps == 0.0
    assert run.watch.answered == 0 and not run.watch.any_ok


async def test_a_level_with_some_errors_runs_to_the_end_and_counts_them() -> None:
    """One request in three answers 500: the level does all its requests (no giving up),
    the 500s are counted by kind, and only answered requests count as input."""
    up = Upstream(fail_every=3)
    async with serving(up) as url:
        run = await run_closed(BenchClient(url), workload(), 2, requests=12)
    s = summarize(run, load_config(None, env={}, overrides={}))
    assert len(run.records) == run.sent == 12 and not run.gave_up
    assert s.error_kinds == {"HTTP 500": 4} and s.ok == 8
    # (tokens / duration) × duration: equal up to float rounding (CI once read 56.000…01)
    assert s.input_tps * s.duration_s == pytest.approx(8 * 7, rel=1e-9)
    assert next(r.error for r in run.records if r.status == 500) == "HTTP 500: engine overloaded"


async def test_cli_unreachable_target_is_one_error_line_and_exit_1() -> None:
    """A dead port with the default 30 s levels: ends in seconds with one line that says
    what happened and how often, exit 1; on stdout only --json's document (a script reading
    it learns what failed), nothing in text mode."""
    code, out, err, took = await bench(f"http://127.0.0.1:{closed_port()}",
                                       "--concurrency", "1,2", "--json")
    assert code == 1, err
    assert [s["level"] for s in json.loads(out)["steps"]] == [1]
    code, text_out, _, _ = await bench(f"http://127.0.0.1:{closed_port()}",
                                       "--concurrency", "1", "--requests", "2")
    assert code == 1 and text_out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("llmtop bench: error: no request to ") and "succeeded" in last
    assert "connection refused" in last and "concurrency 1" in last
    assert "concurrency 2" not in err  # no point in more load on a dead target
    assert "Traceback" not in err and took < 30


async def test_cli_server_that_rejects_everything_says_so() -> None:
    """Every request answered 500: exit 1, the error names the status and the server's own
    message."""
    async with serving(Upstream(fail_every=1)) as url:
        code, out, err, _ = await bench(url, "--concurrency", "1", "--requests", "3")
    assert code == 1 and out == ""
    last = err.strip().splitlines()[-1]
    assert "3 HTTP 500" in last and "engine overloaded" in last, err


async def test_cli_errors_listed_by_kind_and_run_goes_on() -> None:
    """A level with some 500s: exit 0 as before, the table is followed by the errors by
    kind, and the JSON carries them."""
    async with serving(Upstream(fail_every=4)) as url:
        code, out, err, _ = await bench(url, "--concurrency", "1", "--requests", "8")
        code_j, out_j, _, _ = await bench(url, "--concurrency", "1", "--requests", "8",
                                          "--json")
    assert code == 0, err
    assert "errors at concurrency 1: 2 HTTP 500" in out
    assert "errors: 2 HTTP 500" in err  # the progress line too
    assert code_j == 0
    step = json.loads(out_j)["steps"][0]
    assert step["error_kinds"] == {"HTTP 500": 2} and step["requests"] == 8


async def test_cli_target_that_goes_away_mid_run_stops_the_run() -> None:
    """The target answers 4 requests then stops listening (a proxy that died): level 1 is
    shown, level 2 gives up at once instead of hammering the dead port, the run stops there
    with a line that says why, exit 1."""
    up = Upstream(serve_ok=4)
    async with serving(up) as url:
        code, out, err, took = await bench(url, "--concurrency", "1,2,4", "--requests", "4")
    assert code == 1, err
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()
            or ln.startswith("▶")]
    assert [r[1] if r[0] == "▶" else r[0] for r in rows] == ["1", "2"], out
    assert "errors at concurrency 2:" in out and "connection refused" in out
    assert "concurrency 4" not in err + out
    assert "the target stopped answering (concurrency 2:" in err.strip().splitlines()[-1]
    assert took < 30
