"""llmtop bench against an endpoint that wants an API key or other headers: ``--api-key``
(or ``$LLMTOP_BENCH_API_KEY``) and ``--header`` reach every request, and neither reaches
the recording or the output; malformed or hop-by-hop headers are usage errors (exit 2)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from net_support import chat_engine

SSE_OK = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\n'
          b"data: [DONE]\n\n")
KEY = "sk-test-0123456789abcdef"


@asynccontextmanager
async def keyed_engine(seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """An OpenAI-style engine that answers 401 without ``Bearer KEY`` (as vLLM --api-key
    does) and keeps every request's headers."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        seen.append(dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(SSE_OK)
        await resp.write_eof()
        return resp

    async with chat_engine(handle) as url:
        yield url


async def bench(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", *args, "--requests", "3",
        "--max-tokens", "1", "--prompt-tokens", "4",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "LLMTOP_BENCH_API_KEY"},
             **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("how", ["flag", "env"])
async def test_the_api_key_and_headers_reach_every_request_and_nothing_else(
        tmp_path: Path, how: str) -> None:
    seen: list[dict[str, str]] = []
    rec = tmp_path / "run.jsonl"
    async with keyed_engine(seen) as url:
        args = [url, "--header", "X-Tenant: team-a", "--record", str(rec), "--json"]
        if how == "flag":
            code, out, err = await bench(*args, "--api-key", KEY)
        else:
            code, out, err = await bench(*args, env={"LLMTOP_BENCH_API_KEY": KEY})
    assert code == 0, err
    assert len(seen) == 3
    assert all(h.get("Authorization") == f"Bearer {KEY}" for h in seen), seen
    assert all(h.get("X-Tenant") == "team-a" for h in seen), seen
    assert '"ok": 3' in out, out  # --json: the level's three requests all succeeded
    for text in (out, err, rec.read_text()):
        assert KEY not in text and "team-a" not in text


async def test_without_the_key_the_engines_401_is_counted_and_named() -> None:
    seen: list[dict[str, str]] = []
    async with keyed_engine(seen) as url:
        code, _, err = await bench(url)
    assert code == 1  # nothing succeeded
    assert "HTTP 401" in err, err
    assert seen and all("Authorization" not in h for h in seen)


@pytest.mark.parametrize(("args", "said"), [
    (["--header", "X-Tenant team-a"], "must be 'NAME: VALUE'"),
    (["--header", "Bad Name: x"], "must be 'NAME: VALUE'"),
    (["--header", "Content-Length: 5"], "set by the HTTP client itself"),
    (["--header", "Connection: close"], "set by the HTTP client itself"),
    (["--api-key", KEY, "--header", "authorization: Bearer x"], "give one of them"),
    (["--api-key", " spaced "], "may not hold spaces"),
    (["--url", "http://me:secret@127.0.0.1:9"], "must not contain user:password@"),
])
async def test_bad_headers_are_usage_errors(args: list[str], said: str) -> None:
    url = args[1] if args[0] == "--url" else "http://127.0.0.1:9"
    code, _, err = await bench(url, *(args if args[0] != "--url" else []))
    assert code == 2
    assert said in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
