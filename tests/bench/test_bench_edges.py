"""llmtop bench at its edges: Ctrl-C in the moments between a level's requests and its
summary, levels that sent nothing, and figures checked against what the client saw."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from aiohttp import web
from net_support import serving


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"id": "chatcmpl-1", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


async def quick_answer(request: web.Request) -> web.StreamResponse:
    """Two content events and the usage, at once."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(2):
        await resp.write(event({"id": "chatcmpl-1",
                                "choices": [{"index": 0, "delta": {"content": "a"}}]}))
    await resp.write(event(USAGE))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def test_ctrl_c_while_a_level_reads_the_gpus_keeps_that_level(tmp_path: Path) -> None:
    """With --admin, a level that had no GPU reading inside it asks for one after its
    requests are done. A Ctrl-C then (an admin API slow to answer holds bench there up to
    5 s a level) lost the finished level: no row in the results, no summary line in the
    recording, though its requests were recorded. The level is kept (without readings).
    (The readings asked for while the level runs come without a time, so none is inside
    it; once its three requests are answered every snapshot hangs.)"""
    answered = 0
    asked_again, release = asyncio.Event(), asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal answered
        resp = await quick_answer(request)
        answered += 1
        return resp

    async def snapshot(request: web.Request) -> web.Response:
        if answered >= 3:  # the probe of --admin and the level's own answer at once
            asked_again.set()
            await release.wait()
        return web.json_response({"gpus": [{"index": 0, "mem_used_bytes": 1,
                                            "mem_total_bytes": 2}]})

    rec = tmp_path / "b.jsonl"
    async with serving(web.post("/v1/chat/completions", answer),
                       web.get("/llmtop/v1/snapshot", snapshot)) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", url, "--concurrency", "1,2",
            "--requests", "3", "--json", "--admin", url, "--record", str(rec),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await asyncio.wait_for(asked_again.wait(), 30)
            await asyncio.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            release.set()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = err.decode()
    assert proc.returncode == 130, text
    data = json.loads(out)
    assert [(s["level"], s["requests"]) for s in data["steps"]] == [(1.0, 3)], text
    assert data["best"] == 1.0
    assert data["interrupted"] == "between levels"
    assert "interrupted during between levels" not in data["verdict"]
    assert "interrupted between levels" in data["verdict"]
    assert "results above for the 1 level that finished" in text
    lines = [json.loads(ln) for ln in rec.read_text().splitlines()]
    assert [x["level"] for x in lines if x["type"] == "bench_step"] == [1.0]
    assert sum(x["type"] == "request" for x in lines) == 3


async def test_an_open_loop_level_by_duration_lasts_its_window() -> None:
    """An open-loop level by --duration ended at its last arrival's answer, not at the end
    of its window: its duration, and every rate over it, came out of the span to the last
    arrival. With Poisson arrivals that span is about 1/rate short of the window, so low
    rates read high: --rate 1 --duration 3 measured 5 arrivals over 1.4 s and said 3.6
    req/s (seen against llmtop sim). Constant arrivals here, for a sure count: at 2/s for
    0.9 s, arrivals at 0 and 0.5 s, then the level said 4 req/s over 0.5 s."""
    from llmtop.bench.client import BenchClient
    from llmtop.bench.loadgen import run_open
    from llmtop.bench.summary import summarize
    from llmtop.bench.workload import Length, Workload
    from llmtop.config import load_config

    async with serving(web.post("/v1/chat/completions", quick_answer)) as url:
        run = await run_open(BenchClient(url), Workload(max_tokens=Length(2, 2)), 2.0,
                             duration_s=0.9, poisson=False)
    s = summarize(run, load_config(None, env={}, overrides={}))
    assert s.requests == 2 and s.ok == 2
    assert s.duration_s >= 0.9
    assert s.rps <= 2 / 0.9


async def test_a_rate_level_that_sent_nothing_says_so() -> None:
    """A low rate in a short window can see no arrival at all (Poisson: at 0.2/s in 1 s,
    four times in five). The verdict said 'even rate 0.001/s finished no request', as if
    the target had failed to answer; nothing was sent."""
    async with serving(web.post("/v1/chat/completions", quick_answer)) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", url, "--rate", "0.001",
            "--duration", "1", "--json",  # (seed 0: the first arrival ~1,860 s in)
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    doc = json.loads(out)
    assert [(s["requests"], s["cut_off"]) for s in doc["steps"]] == [(0, 0)]
    assert "finished no request" not in doc["verdict"]
    assert doc["verdict"].endswith(
        "none measured — rate 0.001/s sent no request: no arrival fell in its 1 s window "
        "(about 0.001 on average at this rate; a longer --duration, or --requests, "
        "measures it)"), doc["verdict"]


async def bench_json(url: str, *args: str) -> tuple[int, dict[str, object], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", url, "--json", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out), err.decode()


async def test_a_level_above_its_requests_is_not_a_capacity() -> None:
    """--requests N at a concurrency above N never has more than N requests open: the
    level measures concurrency N. A search with --requests 2 doubled up to --max-level
    and named it the capacity ('max concurrency 64', seen against llmtop sim, from levels
    that each ran 2 requests). Such a level is not counted: the search stops there, a
    list of levels leaves it out, and the output says why."""
    async with serving(web.post("/v1/chat/completions", quick_answer)) as url:
        code, doc, err = await bench_json(url, "--search", "--requests", "2",
                                          "--max-level", "16")
        assert code == 0, err
        steps = doc["steps"]
        assert isinstance(steps, list)
        assert [(s["level"], s["peak_open"]) for s in steps] == [(1, 1), (2, 2), (4, 2)]
        assert doc["best"] == 2
        verdict = doc["verdict"]
        assert isinstance(verdict, str)
        assert ": 2 → " in verdict
        assert ("concurrency 4 not measured: never more than 2 requests open at once "
                "(--requests 2 is fewer than the level)") in verdict

        code, doc, err = await bench_json(url, "--concurrency", "1,8", "--requests", "2")
        assert code == 0, err
        assert doc["best"] == 1
        assert "concurrency 8 not measured" in str(doc["verdict"])

        code, doc, err = await bench_json(url, "--concurrency", "4", "--requests", "4")
        assert code == 0, err
        assert doc["best"] == 4 and "not measured" not in str(doc["verdict"])


async def test_a_rate_search_goes_on_past_a_level_that_sent_nothing() -> None:
    """A rate search whose first level saw no arrival in its window (0.5/s for 1 s: the
    first arrival of seed 0 comes 3.7 s in) took it as a failure: it bisected below it,
    where fewer arrivals still come, and said 'none' of a target that never got a
    request. A level that sent nothing is no evidence either way: the sweep goes on up."""
    async with serving(web.post("/v1/chat/completions", quick_answer)) as url:
        code, doc, err = await bench_json(url, "--rate", "0.5", "--search", "--duration", "1",
                                          "--max-level", "4", "--slo", "ttft=10,itl=10")
    assert code == 0, err
    steps = doc["steps"]
    assert isinstance(steps, list)
    assert [s["level"] for s in steps] == [0.5, 1, 2, 4], err
    # (the arrivals are the seed's: levels 0.5/s and 2/s, seeds 0 and 2, see none)
    assert [s["requests"] == 0 for s in steps] == [True, False, True, False]
    assert doc["best"] == 4
    verdict = str(doc["verdict"])
    assert ": 4 req/s → " in verdict
    assert verdict.endswith("(rate 0.5/s, 2/s not measured: sent no request: no arrival fell "
                            "in their windows (a longer --duration, or --requests, measures "
                            "them))"), verdict
