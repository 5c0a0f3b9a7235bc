"""QA fixes in llmtop bench.

1. A server that closes idle keep-alive connections without saying ``Connection: close``
   (llama.cpp's llama-server does): a request that finds its reused connection dead before
   any byte of an answer is resent once on a fresh connection, counted once, and timed from
   the resend; one whose answer had begun is never resent.
2. ``--slo ttft=0.5,itl_p95=0.05,target=0.95``: the SLOs in one flag (bench and run), merged
   with the --slo-* flags; bad specs are one-line usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest

from llmtop.bench.client import BenchClient, bench_session
from llmtop.bench.loadgen import run_closed, run_open
from llmtop.bench.workload import Length, Workload
from llmtop.cli import build_parser, main
from llmtop.cli.common import UsageError, config_from_args, parse_slo_specs
from llmtop.sim.server import running_sim

SSE_OK = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
          b"data: [DONE]\n\n")
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % len(SSE_OK))

OnReuse = Literal["close", "drop", "cut", "head"]


class RawUpstream:
    """A minimal HTTP/1.1 server on raw asyncio streams that never says ``Connection:
    close`` yet does not keep connections alive:

    - ``close``: closes each connection right after its first response (llama-server
      closing an idle connection; whether the client's next request meets the closed
      socket is a race);
    - ``drop``: reads the next request on a connection, waits ``dead_s``, then closes
      without a byte of answer (the race lost, every time);
    - ``cut``: answers the next request on a connection with the head and part of the
      body, then closes (an answer that had begun: must not be resent);
    - ``head``: the same with part of the head (status line and a header) only.
    """

    def __init__(self, on_reuse: OnReuse, dead_s: float = 0.0) -> None:
        self.on_reuse = on_reuse
        self.dead_s = dead_s
        self.connections = 0
        self.requests = 0
        self.answered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        on_this = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests += 1
                on_this += 1
                if on_this > 1:  # a request on a kept-alive connection
                    if self.on_reuse == "drop":
                        await asyncio.sleep(self.dead_s)
                        return
                    if self.on_reuse in ("cut", "head"):
                        writer.write(HEAD + SSE_OK[:40] if self.on_reuse == "cut"
                                     else HEAD.split(b"Content-Length")[0])
                        await writer.drain()
                        return
                writer.write(HEAD + SSE_OK)
                await writer.drain()
                self.answered += 1
                if self.on_reuse == "close":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def raw_serving(up: RawUpstream) -> AsyncIterator[str]:
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def workload() -> Workload:
    return Workload(prompt_tokens=Length(16, 16), max_tokens=Length(4, 4), seed=1)


@pytest.mark.parametrize("on_reuse", ["close", "drop"])
async def test_dead_kept_alive_connection_is_resent_once_and_counted_once(
        on_reuse: OnReuse) -> None:
    up = RawUpstream(on_reuse)
    async with raw_serving(up) as url:
        client = BenchClient(url)
        run = await run_closed(client, workload(), 1, requests=6)
    assert [r.error for r in run.records if r.outcome != "ok"] == []
    assert len(run.records) == 6 and run.sent == 6
    assert up.answered == 6
    if on_reuse == "drop":  # every other request met a dead connection, which read it
        assert client.retries == 3 and up.requests == 9
    else:  # a request written on a closed socket never reached the server
        assert up.requests == 6 and up.connections == 6


async def test_open_loop_resends_too() -> None:
    up = RawUpstream("drop")
    async with raw_serving(up) as url:
        client = BenchClient(url)
        run = await run_open(client, workload(), 20.0, requests=6, poisson=False)
    assert [r.error for r in run.records if r.outcome != "ok"] == []
    assert len(run.records) == 6 and up.answered == 6
    assert client.retries >= 1 and up.requests == 6 + client.retries


@pytest.mark.parametrize(("on_reuse", "kind", "status"), [
    ("cut", "response cut off", 200), ("head", "server disconnected", 0)])
async def test_an_answer_that_had_begun_is_not_resent(on_reuse: OnReuse, kind: str,
                                                      status: int) -> None:
    up = RawUpstream(on_reuse)
    async with raw_serving(up) as url:
        client = BenchClient(url)
        run = await run_closed(client, workload(), 1, requests=2)
    assert client.retries == 0 and up.requests == 2
    assert [r.outcome for r in run.records] == ["ok", "error"]
    assert run.records[1].status == status
    assert (run.records[1].error or "").startswith(kind), run.records[1].error


async def test_a_fresh_connection_that_dies_is_not_resent() -> None:
    """Only a reused connection is suspect: a server that drops a new connection's request
    has failed it."""
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        await reader.readuntil(b"\r\n\r\n")
        seen += 1
        writer.close()

    seen = 0
    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        client = BenchClient(url)
        async with bench_session(1) as session:
            rec = await client.send(session, workload().next())
    finally:
        server.close()
        await server.wait_closed()
    assert rec.outcome == "error" and (rec.error or "").startswith("server disconnected")
    assert client.retries == 0 and seen == 1


async def test_a_resent_request_is_timed_from_the_resend() -> None:
    """The dead connection holds the request 1 s before it closes; the record's TTFT and
    E2E are the answer's (ms on loopback), not the dead socket's second. Open loop: the
    delay between the scheduled time and the first send still counts.

    Bounded by causality, not seconds: the first send came before the server's 1 s hold
    began and the resend after it ended, so a record timed from the resend (plus, open loop,
    the lateness before the first send) is at least ``dead_s`` shorter than the call; one
    timed from the first send is not. A pause of the test process (client and server share
    it) lengthens the call as much as the record, where '< 0.8 s' (against 1 s when wrong)
    failed on any pause over 0.3 s once the resend had begun."""
    up = RawUpstream("drop", dead_s=1.0)
    async with raw_serving(up) as url:
        client = BenchClient(url)
        async with bench_session(1) as session:
            first = await client.send(session, workload().next())
            t_before = time.time()
            call2 = time.perf_counter_ns()
            second = await client.send(session, workload().next())
            span2 = (time.perf_counter_ns() - call2) / 1e9
            late_ns = 200_000_000  # scheduled 0.2 s ago: the sender was late
            third = await client.send(session, workload().next(),
                                      scheduled_ns=time.perf_counter_ns() - late_ns)
            sched4 = time.perf_counter_ns() - late_ns
            fourth = await client.send(session, workload().next(), scheduled_ns=sched4)
            span4 = (time.perf_counter_ns() - sched4) / 1e9
    assert [r.outcome for r in (first, second, third, fourth)] == ["ok"] * 4
    assert client.retries == 2  # the second and the fourth met the dead connection
    slack = 1e-3
    assert second.e2e_s is not None and second.e2e_s <= span2 - up.dead_s + slack, \
        (second.e2e_s, span2)
    assert second.ttft_s is not None and second.ttft_s <= span2 - up.dead_s + slack
    assert second.t_start >= t_before + 0.9  # it started when it was resent
    assert fourth.e2e_s is not None and 0.2 <= fourth.e2e_s <= span4 - up.dead_s + slack, \
        (fourth.e2e_s, span4)
    assert third.e2e_s is not None and third.e2e_s >= 0.2


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_against_a_server_that_closes_idle_connections_has_no_errors() -> None:
    """The QA case: concurrency 1, 4 requests, straight at a llama-server-like target."""
    up = RawUpstream("drop")
    async with raw_serving(up) as url:
        code, out, err = await cli("bench", url, "--concurrency", "1", "--requests", "4",
                                   "--prompt-tokens", "16", "--max-tokens", "4", "--json")
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    assert step["requests"] == 4 and step["errors"] == 0, step
    assert up.answered == 4 and up.requests > 4



# --- 2. --slo SPEC -----------------------------------------------------------------------

CLOSED = "http://127.0.0.1:1"


def test_slo_specs_parse_to_config_fields() -> None:
    assert parse_slo_specs(["ttft=0.5,itl=0.05", " target = 0.9 , E2E=30", "tpot=0.02"]) == {
        "ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.9, "e2e_s": 30.0, "tpot_s": 0.02}
    assert parse_slo_specs(["itl_p95=0.05", "itl=0.05"]) == {"itl_p95_s": 0.05}
    assert parse_slo_specs(None) == {} and parse_slo_specs(["target=1"]) == {"target": 1.0}
    with pytest.raises(UsageError, match=r"itl_p95 twice: 0\.05 and 0\.04"):
        parse_slo_specs(["itl=0.05,itl_p95=0.04"])


@pytest.mark.parametrize(("args", "says"), [
    (["--slo", "foo=1"], "unknown key 'foo'"),
    (["--slo", "ttft=abc"], "ttft=abc must be a number of seconds"),
    (["--slo", "ttft=nan"], "ttft=nan must be"),
    (["--slo", "e2e=inf"], "e2e=inf must be"),
    (["--slo", "tpot=0"], "more than 0"),
    (["--slo", "ttft=-1"], "more than 0"),
    (["--slo", "ttft=100000"], "at most 86,400"),
    (["--slo", "target=0"], "target=0 must be a share"),
    (["--slo", "target=1.5"], "target=1.5 must be a share"),
    (["--slo", "target=nan"], "target=nan"),
    (["--slo", "ttft"], "'ttft' is not KEY=VALUE"),
    (["--slo", "ttft=0.5,,e2e=1"], "empty item"),
    (["--slo", ""], "empty item"),
    (["--slo", "ttft=0.5", "--slo-ttft", "0.3"], "--slo-ttft 0.3 and --slo ttft=0.5 disagree"),
    (["--slo", "ttft=0.5", "--slo", "ttft=0.3"], "ttft twice"),
    (["--slo-target", "0.9", "--slo", "target=0.95"], "--slo-target 0.9 and --slo target"),
])
def test_bad_slo_specs_are_one_line_usage_errors(args: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any request (the target is a closed port), for bench and run."""
    for argv, prefix in ((["bench", CLOSED, "--requests", "1", *args], "llmtop bench"),
                         (["run", "--upstream", CLOSED, *args], "llmtop run")):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"{prefix}: error: ") and says in err, err


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_run_takes_slo_specs_into_its_config() -> None:
    cfg = config_from_args(parsed("run", "--upstream", CLOSED, "--slo", "ttft=0.3,itl=0.04",
                                  "--slo", "target=0.9", "--slo-e2e", "20",
                                  "--slo-ttft", "0.3"))
    assert (cfg.slo.ttft_s, cfg.slo.itl_p95_s, cfg.slo.target, cfg.slo.e2e_s) == (
        0.3, 0.04, 0.9, 20.0)
    assert cfg.slo.tpot_s is None
    plain = config_from_args(parsed("run", "--upstream", CLOSED))
    assert (plain.slo.ttft_s, plain.slo.target) == (0.5, 0.95)  # the defaults stay


@pytest.mark.parametrize("command", ["bench", "run", "report"])
def test_help_explains_slo(command: str) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices[command].format_help().split())
    assert "--slo KEY=V,..." in text
    assert "e.g. ttft=0.5,itl_p95=0.05,target=0.95" in text
    assert "keys: ttft, itl_p95 (or itl), tpot, e2e in seconds, target" in text


async def test_bench_against_the_simulator_uses_the_slo_spec(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """End to end: the SLOs given with --slo (and one --slo-* flag) are the run's, in its
    JSON and its recording; llmtop report --slo judges a recording like --slo-* does."""
    rec = tmp_path / "b.jsonl"
    async with running_sim("tiny") as sim:
        code, out, err = await cli("bench", sim.url, "--requests", "2", "--prompt-tokens", "16",
                                   "--max-tokens", "4", "--slo", "ttft=2,itl_p95=0.5",
                                   "--slo", "target=0.5", "--slo-e2e", "30", "--json",
                                   "--record", str(rec))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["slo"] == {"ttft_s": 2.0, "itl_p95_s": 0.5, "target": 0.5, "e2e_s": 30.0}
    assert doc["steps"][0]["requests"] == 2 and doc["steps"][0]["slo_attainment"] == 1.0
    reports = []
    for argv in (["--slo", "ttft=0.000001,target=0.9"],
                 ["--slo-ttft", "0.000001", "--slo-target", "0.9"]):
        assert main(["report", str(rec), "--format", "json", "-q", *argv]) == 0
        reports.append(json.loads(capsys.readouterr().out)["slo"])
    assert reports[0] == reports[1]
    assert reports[0]["ttft_s"] == 0.000001 and reports[0]["attainment"] == 0.0
    assert main(["report", str(rec), "-q", "--slo", "ttft=x"]) == 2
    assert "ttft=x must be a number" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["no directory", "a directory", "zstd", "exists"])
def test_bench_refuses_an_unusable_record_path_with_one_line(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench --record` into a missing directory raised RecordingError as a traceback once
    the run began; now every path the recorder would refuse is a usage error before any
    request (the upstream here is a closed port: nothing may be sent to it)."""
    path = {"no directory": tmp_path / "nope" / "b.jsonl", "a directory": tmp_path,
            "zstd": tmp_path / "b.jsonl.zst", "exists": tmp_path / "old.jsonl"}[case]
    if case == "exists":
        path.write_text("keep me\n")
    code = main(["bench", "http://127.0.0.1:9", "--requests", "1", "--record", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("llmtop bench: error: --record:")
    assert {"no directory": "directory does not exist", "a directory": "is a directory",
            "zstd": "not zstd", "exists": "file exists"}[case] in err
    assert case != "exists" or path.read_text() == "keep me\n"
    assert case != "zstd" or not path.exists()
