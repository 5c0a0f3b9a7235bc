"""`llmtop bench`'s records name the engine's own id of each request (``upstream_id``), as
the proxy's do: the response's ``X-Request-Id``, else the id the stream's first event
gives — so a bench run can be looked up in the engine's logs. ``llmtop sim`` gives each
request its own ``chatcmpl-…``/``cmpl-…`` and keeps it in its ground truth."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from net_support import chat_engine

from llmtop.bench.client import BenchClient, bench_session
from llmtop.bench.workload import BenchRequest
from llmtop.events import RequestRecord
from llmtop.proxy.dialects._common import MAX_UPSTREAM_ID_CHARS
from llmtop.recording.reader import iter_recording
from llmtop.sim.server import running_sim


async def test_the_recording_names_the_sims_id_of_every_request(tmp_path: Path) -> None:
    """``llmtop bench --record`` against the simulator, chat and completions: every
    recorded request's ``upstream_id`` is one the simulator gave, each its own."""
    for api, prefix in (("chat", "chatcmpl-"), ("completions", "cmpl-")):
        rec = tmp_path / f"{api}.jsonl"
        async with running_sim("tiny") as sim:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmtop", "bench", sim.url, "--api", api,
                "--concurrency", "2", "--requests", "6", "--max-tokens", "4",
                "--prompt-tokens", "8", "--record", str(rec),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 90)
            truth = [r["id"] for r in sim.engine.records()]
        assert proc.returncode == 0, err.decode()
        recs = [x for x in iter_recording(rec) if isinstance(x, RequestRecord)]
        ids = [r.upstream_id for r in recs]
        assert len(recs) >= 6 and all(r.outcome == "ok" for r in recs), recs
        assert all(i is not None and i.startswith(prefix) for i in ids), ids
        assert len(set(ids)) == len(ids) and set(ids) <= set(truth), (ids, truth)


SSE = (b'data: {"id":"chatcmpl-body","object":"chat.completion.chunk","model":"m",'
       b'"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
       b'data: {"id":"chatcmpl-body","choices":[],"usage":{"prompt_tokens":3,'
       b'"completion_tokens":1}}\n\n'
       b"data: [DONE]\n\n")


@asynccontextmanager
async def engine_with_request_ids() -> AsyncIterator[str]:
    """An OpenAI-style engine that names each request in ``X-Request-Id`` fields as the
    request's ``user`` header asks (vLLM's ``--enable-request-id-headers``)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        case = request.headers["X-LLMTOP-User"]
        fields = {"plain": ["vllm-req-1"], "none": [], "empty-first": ["  ", " req-2 "],
                  "long": ["r" * 300], "error": ["req-err"]}[case]
        if case == "error":
            return web.json_response({"error": {"message": "busy", "type": "overloaded"}},
                                     status=503, headers={"X-Request-Id": "req-err"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        for value in fields:
            resp.headers.add("X-Request-Id", value)
        await resp.prepare(request)
        await resp.write(SSE)
        await resp.write_eof()
        return resp

    async with chat_engine(handle) as url:
        yield url


async def test_x_request_id_is_taken_before_the_bodys_id() -> None:
    got: dict[str, RequestRecord] = {}
    async with engine_with_request_ids() as url, bench_session(1) as session:
        for case in ("plain", "none", "empty-first", "long", "error"):
            client = BenchClient(url, user=case)
            got[case] = await client.send(session, BenchRequest("hi", 1, 1))
    assert {k: r.upstream_id for k, r in got.items()} == {
        "plain": "vllm-req-1",  # the header wins
        "none": "chatcmpl-body",  # no header: the first event's id
        "empty-first": "req-2",  # the first non-empty field, without its spaces
        "long": "r" * MAX_UPSTREAM_ID_CHARS,
        "error": "req-err",  # a failed answer keeps the engine's id too
    }
    assert (got["error"].status, got["error"].outcome) == (503, "error")
