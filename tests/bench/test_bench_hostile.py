"""llmtop bench against engines that answer oddly: usage with absurd token counts, and a
non-streaming JSON answer to a streaming request. bench must neither crash nor report
figures the proxy would not."""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from net_support import chat_engine

from llmtop.bench.client import DONE_GRACE_S
from llmtop.events import RequestRecord
from llmtop.metrics.slo import rank_of_percentile, request_itl_p95


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CONTENT = event({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "a"}}]})


@asynccontextmanager
async def streaming_engine(usage: Callable[[], bytes]) -> AsyncIterator[str]:
    """Four content events 5 ms apart, then ``usage()`` as the usage event."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(CONTENT)
            await asyncio.sleep(0.005)
        await resp.write(usage())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async with chat_engine(handle) as url:
        yield url


def one_event_then(gate: asyncio.Event) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that answers one content event, then holds the stream open until
    ``gate`` is set (a stalled engine)."""

    async def stalled(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CONTENT)
        await gate.wait()
        return resp

    return stalled


async def bench(url: str, *extra: str) -> tuple[int, str, str]:
    size = () if "--duration" in extra or "--requests" in extra else ("--requests", "3")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", url, *size, "--json", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_huge_usage_count_is_summarised_without_running_out_of_memory() -> None:
    """An engine that says it generated 2**40 tokens (a counter bug; the most a count may
    be, llmtop.proxy.dialects._common.MAX_TOKENS): bench died with a MemoryError
    traceback after its first level (seen with 10**15), as the per-request ITL p95 of the
    SLO detail spread each chunk into one list item per token (8 TB for this stream; 30 M
    tokens took a second and 240 MB per request). The proxy's aggregator weighs samples
    instead, and so does bench now: the figures are what the engine said."""
    from llmtop.proxy.dialects._common import MAX_TOKENS

    big = MAX_TOKENS

    def usage() -> bytes:
        return event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": big}})

    async with streaming_engine(usage) as url:
        code, out, err = await bench(url)
    assert code == 0, err
    assert "Traceback" not in err
    step = json.loads(out)["steps"][0]
    assert step["ok"] == 3
    assert step["token_sources"] == {"usage": 3}
    assert math.isclose(step["output_tps"] * step["duration_s"], big * 3, rel_tol=1e-9)
    detail = step["slo_detail"]["itl_p95"]
    assert detail["met"] == 1.0  # the last gap split 2**40 - 3 ways: tiny samples
    assert detail["at_target"] is not None and detail["at_target"] < 1e-9


async def test_a_count_past_int64_is_no_count() -> None:
    """Usage of 10**400 tokens (JSON has no limit, Python's int neither): bench died with
    an OverflowError traceback (int too large to convert to float), and a count of 2**63
    or more made the aggregator file none of the level's requests (SLO attainment n/a).
    Such a count is now no count, like a negative one: the stream is counted by its
    events."""
    huge = b"1" + b"0" * 400

    def usage() -> bytes:
        return (b'data: {"choices":[],"usage":{"prompt_tokens":' + huge
                + b',"completion_tokens":' + str(2**63).encode() + b"}}\n\n")

    async with streaming_engine(usage) as url:
        code, out, err = await bench(url, "--slo", "ttft=10,itl=10")  # (room for pauses)
    assert code == 0, err
    assert "Traceback" not in err
    step = json.loads(out)["steps"][0]
    assert (step["ok"], step["token_sources"]) == (3, {"chunks": 3})
    assert step["slo_attainment"] == 1.0  # (None when the aggregator filed no request)
    assert math.isclose(step["output_tps"] * step["duration_s"], 4 * 3, rel_tol=1e-9)
    assert step["input_tps"] == 0


async def test_a_json_answer_to_a_streaming_request_is_not_a_stream() -> None:
    """An engine that ignores ``stream: true`` and answers one JSON body after 50 ms: bench
    recorded it as streamed, so its TPOT was 0 ms (the whole answer arrives at once) and
    its per-request speed absurd, and TTFT (the whole body) was judged against the TTFT
    objective. The proxy records such an answer as not streamed (its content type says
    so), which leaves TPOT, ITL and TTFT's objective out; bench now does the same."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(0.05)
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi " * 30},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 30}})

    async with chat_engine(handle) as url:
        code, out, err = await bench(url, "--slo", "ttft=0.01,tpot=0.001")
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    assert (step["ok"], step["token_sources"]) == (3, {"usage": 3})
    assert step["latency"]["tpot"]["p50"] is None
    assert step["latency"]["itl"]["p50"] is None
    assert step["per_request_tps_p50"] is None
    assert step["slo_detail"]["tpot"]["at_target"] is None
    assert step["slo_attainment"] == 1.0  # nothing streamed: no TTFT, no TPOT to miss


async def test_the_slo_detail_judges_ttft_as_the_attainment_does() -> None:
    """JSON answers (not streamed) to a level that fails its E2E objective: the verdict
    listed "TTFT ≤ 10 ms (met by 0% of requests …)" among the misses — the detail judged
    each body's whole time as a TTFT, where the attainment (the proxy's rule) does not
    judge TTFT for an answer that is not a stream."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(0.05)
        return web.json_response({
            "id": "chatcmpl-1", "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}})

    async with chat_engine(handle) as url:
        code, out, err = await bench(url, "--slo", "ttft=0.01,itl=10,e2e=0.001")
    assert code == 0, err
    doc = json.loads(out)
    detail = doc["steps"][0]["slo_detail"]
    assert detail["ttft"]["met"] == 1.0 and detail["ttft"]["at_target"] is None
    assert detail["e2e"]["met"] == 0.0
    assert "misses E2E" in doc["verdict"] and "TTFT ≤" not in doc["verdict"]


def record(offsets: list[float], tokens: list[int], stream: bool = True) -> RequestRecord:
    return RequestRecord(
        id="r", user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=stream, status=200, outcome="ok", t_start=0.0,
        ttft_s=offsets[0] if offsets else None, e2e_s=(offsets[-1] if offsets else 0) + 0.01,
        prompt_tokens=1, completion_tokens=sum(tokens) or None, token_source="usage",
        chunk_offsets_s=tuple(offsets), chunk_tokens=tuple(tokens))


def test_request_itl_p95_is_the_p95_of_the_spread_samples() -> None:
    """The weighted P95 (bench's SLO detail and the SLO rules share it) is the P95 of
    the samples spread one per token, for streams of every shape (counts of 0, 1 and
    more; counts missing)."""
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(0, 12)
        offsets = sorted(rng.uniform(0, 2) for _ in range(n))
        tokens = [rng.choice((0, 1, 1, 1, 2, 3, 17)) for _ in range(rng.randint(0, n))]
        r = record(offsets, tokens, stream=rng.random() < 0.9)
        spread = sorted(r.itl_samples_s()) if r.stream else []
        want = spread[rank_of_percentile(len(spread)) - 1] if spread else None
        assert request_itl_p95(r) == want, (offsets, tokens)


async def test_an_open_loop_level_that_dropped_arrivals_does_not_pass() -> None:
    """Open loop with more requests open than it may hold (10,000 from the command line):
    the arrivals over that were not sent (``overflow``), and nothing but the JSON said so.
    The level's figures leave out exactly the requests a stalled server would have made
    slow, so it passed and could be the verdict's capacity. It now fails, and the text
    output and verdict say why."""
    from llmtop.bench.client import BenchClient
    from llmtop.bench.loadgen import run_open
    from llmtop.bench.output import error_lines, verdict
    from llmtop.bench.search import SearchResult, passes
    from llmtop.bench.summary import summarize
    from llmtop.bench.workload import Length, Workload
    from llmtop.config import load_config

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CONTENT)
        await asyncio.sleep(0.3)
        await resp.write(CONTENT + event({"choices": [], "usage": {
            "prompt_tokens": 7, "completion_tokens": 2}}) + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    cfg = load_config(None, env={}, overrides={"slo.ttft_s": 10.0, "slo.itl_p95_s": 10.0})
    async with chat_engine(slow) as url:
        run = await run_open(BenchClient(url), Workload(max_tokens=Length(2, 2)), 100.0,
                             requests=20, poisson=False, max_outstanding=3)
    s = summarize(run, cfg)
    assert s.overflow > 0 and s.ok == s.requests
    assert s.slo_attainment == 1.0
    assert not passes(s, cfg.slo.target)
    result = SearchResult([s], None, s)
    said = "\n".join(error_lines(result, "rate"))
    assert f"{s.overflow} arrivals not sent" in said
    shown = verdict(result, "rate", cfg)
    assert ": none — even rate 100/s" in shown and "arrivals not sent" in shown


async def test_constant_arrivals_fill_the_window_at_the_rate() -> None:
    """--rate 10 --constant for 0.5 s sent 4 requests, not 5: the first arrival came one
    gap after the level began, so a window held rate × duration − 1 of them (--rate 1
    --duration 3: 2 requests, an offered 0.67/s), and --requests 1 at 0.01/s sent nothing
    for 100 s. Constant arrivals now begin at the level's start."""
    from llmtop.bench.client import BenchClient
    from llmtop.bench.loadgen import run_open
    from llmtop.bench.workload import Length, Workload

    async def quick(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CONTENT + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async with chat_engine(quick) as url:
        w = Workload(max_tokens=Length(1, 1))
        run = await run_open(BenchClient(url), w, 10.0, duration_s=0.5, poisson=False)
        slow = await run_open(BenchClient(url), w, 0.01, requests=1, poisson=False)
    assert len(run.records) == 5
    assert len(slow.records) == 1 and slow.records[0].outcome == "ok"
    assert slow.ended - slow.started < 5


async def test_a_target_that_never_answers_is_an_error_not_an_empty_level() -> None:
    """An engine that takes requests and never answers (hung): each level's requests were
    cut off at its deadline unanswered, and bench said "even concurrency 1 finished no
    request" with exit status 0 — not that nothing had answered at all, and the help
    promises exit 1 when no request succeeded. It now ends as for a dead target, with the
    reason; a level whose open requests had begun to answer (slower than the level) says
    so in the verdict."""
    gate = asyncio.Event()

    async def hung(request: web.Request) -> web.StreamResponse:
        await request.read()
        await gate.wait()
        return web.Response(status=503)

    async with chat_engine(hung) as url:
        code, out, err = await bench(url, "--concurrency", "1,2",
                                     "--duration", "0.5", "--warmup", "0")
        gate.set()
    assert code == 1, err
    doc = json.loads(out)
    assert [(s["level"], s["requests"], s["cut_off"], s["cut_off_answered"])
            for s in doc["steps"]] == [(1, 0, 1, 0)]
    assert doc["stopped"].endswith("(concurrency 1: none of its 1 open request had an answer "
                                   "when the level ended)")
    assert "llmtop bench: error: no request to" in err

    gate.clear()
    async with chat_engine(one_event_then(gate)) as url:
        code, out, err = await bench(url, "--duration", "0.5", "--warmup", "0")
        gate.set()
    assert code == 0, err
    assert json.loads(out)["verdict"].endswith(
        "even concurrency 1 finished no request (1 open at the level's end; 1 had begun to "
        "answer)")


async def test_an_open_loop_level_says_it_waits_for_its_open_requests() -> None:
    """After its last arrival an open-loop level waits for the requests still open, each
    until it ends or --timeout (600 s by default) ends it: with a stalled engine bench sat
    silent after "rate 5/s: starting" for as long. It now says what it waits for."""
    gate = asyncio.Event()
    async with chat_engine(one_event_then(gate)) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", url, "--rate", "5", "--constant",
            "--duration", "0.5", "--warmup", "0", "--timeout", "30",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        try:
            said = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert said.startswith("rate 5/s: starting")
            said = (await asyncio.wait_for(proc.stderr.readline(), 10)).decode()
        finally:
            gate.set()
            await asyncio.wait_for(proc.communicate(), 30)
    assert said == ("rate 5/s: all arrivals sent; waiting for the 3 requests still open "
                    "(each until it ends or times out)\n")


async def test_a_stream_whose_body_stays_open_after_done_is_whole(tmp_path: Path) -> None:
    """An engine that sends the whole answer, its usage and ``data: [DONE]`` but keeps the
    response open (never ends the chunked body): every request was a timeout to bench
    ("no request succeeded", exit 1), while an llmtop proxy in front records each as ok
    with its usage — the end marker is the answer's end. bench now takes the request as
    done at the marker when the body does not end within DONE_GRACE_S, and times it
    there."""
    gate = asyncio.Event()

    async def open_after_done(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(CONTENT)
        await resp.write(event({"choices": [], "usage": {"prompt_tokens": 7,
                                                         "completion_tokens": 4}}))
        await resp.write(b"data: [DONE]\n\n")
        await gate.wait()
        return resp

    rec = tmp_path / "r.jsonl"
    async with chat_engine(open_after_done) as url:
        try:
            code, out, err = await bench(url, "--timeout", "5", "--record", str(rec))
        finally:
            gate.set()
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    assert (step["ok"], step["errors"], step["timeouts"]) == (3, 0, 0)
    assert step["token_sources"] == {"usage": 3}
    assert step["output_tps"] * step["duration_s"] == pytest.approx(12)
    # timed at the marker (written with the last tokens), not after the grace
    reqs = [r for r in map(json.loads, rec.read_text().splitlines()) if "e2e_s" in r]
    assert len(reqs) == 3
    assert all(r["e2e_s"] - r["chunk_offsets_s"][-1] < DONE_GRACE_S for r in reqs)


async def test_answers_without_any_output_are_named_as_such() -> None:
    """A URL that is not an LLM endpoint but answers 200 (a web server's page): the
    verdict read "even concurrency 1 misses TTFT ≤ 500 ms (met by 0% of requests)", as if
    the engine were slow, for answers that came in 3 ms without a token. It now says
    that no answer carried any output."""

    async def page(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(text="<html><body>Welcome to nginx!</body></html>",
                            content_type="text/html")

    async with chat_engine(page) as url:
        code, out, err = await bench(url)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["steps"][0]["ok"], doc["steps"][0]["no_output"]) == (3, 3)
    assert doc["verdict"].endswith(
        ": none — even concurrency 1 got no output in any of its 3 successful answers (not "
        "a token: is the URL an OpenAI-compatible endpoint?)")


async def test_one_request_is_said_in_the_singular(tmp_path: Path) -> None:
    """"concurrency 1: 1 requests, …" and "recorded 1 requests to …"."""

    def usage() -> bytes:
        return event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})

    async with streaming_engine(usage) as url:
        code, _, err = await bench(url, "--requests", "1", "--record",
                                   str(tmp_path / "one.jsonl"))
    assert code == 0, err
    assert "concurrency 1: 1 request, " in err
    assert f"recorded 1 request to {tmp_path / 'one.jsonl'}" in err
    assert "1 requests" not in err


async def test_a_search_where_nothing_failed_does_not_claim_a_higher_limit() -> None:
    """Every level up to --max-level passed: the verdict said "the limit is higher", which
    nothing measured (it may be the last level); ``llmtop report`` of the same run says
    "may be higher"."""

    def usage() -> bytes:
        return event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})

    async with streaming_engine(usage) as url:
        code, out, err = await bench(url, "--search", "--max-level", "2", "--requests", "2",
                                     "--slo", "ttft=10,itl=10")
    assert code == 0, err
    doc = json.loads(out)
    assert [s["level"] for s in doc["steps"]] == [1, 2] and doc["best"] == 2
    assert doc["verdict"].endswith("(no level failed: the limit may be higher)")
