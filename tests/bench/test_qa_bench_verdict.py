"""QA: a fixed list of levels where a lower level failed and a higher one passed (a hiccup
at concurrency 2, say) must not report the higher one as the capacity: the verdict is the
largest passing level below the lowest failing one, and it says the results are not
monotonic."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from net_support import chat_engine

SSE_OK = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
          b"data: [DONE]\n\n")


@asynccontextmanager
async def hiccup_upstream(bad: range) -> AsyncIterator[str]:
    """Request n (from 1) answers HTTP 500 when n is in ``bad``, else a short stream."""
    n = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal n
        await request.read()
        n += 1
        if n in bad:
            return web.json_response({"error": {"message": "hiccup"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(SSE_OK)
        await resp.write_eof()
        return resp

    async with chat_engine(handle) as url:
        yield url


async def bench(url: str, *extra: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", url, "--concurrency", "1,2,4",
        "--requests", "4", "--slo", "ttft=10,itl=10", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_pass_above_a_failed_level_is_not_the_capacity() -> None:
    async with hiccup_upstream(range(5, 9)) as url:  # concurrency 2's 4 requests fail
        code, out, err = await bench(url, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [s["level"] for s in doc["steps"]] == [1, 2, 4]
    assert [s["errors"] for s in doc["steps"]] == [0, 4, 0]
    assert doc["best"] == 1, doc["verdict"]
    assert ": 1 → " in doc["verdict"] and "not monotonic" in doc["verdict"], doc["verdict"]


async def test_table_marks_the_level_the_verdict_names() -> None:
    async with hiccup_upstream(range(5, 9)) as url:
        code, out, err = await bench(url)
    assert code == 0, err
    marked = [line.split()[1] for line in out.splitlines() if line.startswith("▶")]
    assert marked == ["1"], out
    assert "4 passed, above the failed 2" in out.splitlines()[-1], out
