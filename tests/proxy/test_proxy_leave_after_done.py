"""A client that leaves as soon as it has read the stream's end marker got the whole answer.

QA (real llama.cpp, and `--workers 2` against the simulator): the sync openai SDK breaks
out of its loop on ``data: [DONE]`` and closes the connection without reading the chunked
terminator; when that close reached the proxy before the upstream's own end of body, the
complete stream was recorded ``cancelled / client disconnected`` — 2 of 30 requests with
one worker, 12 of 30 with two — and dropped from E2E, TPOT and the SLO judgement. Here the
upstream waits 300 ms between ``[DONE]`` and its end of body, so the close always comes
first; both the first request on a connection (aiohttp's handler) and a later one (the
direct path) are checked, and a client that leaves before ``[DONE]`` is still cancelled.
"""

from __future__ import annotations

import asyncio
import json

from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

SSE = {"Content-Type": "text/event-stream"}
BODY = json.dumps({"model": "m1", "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def _request(host: str) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: " +
            str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


async def _ask(url: str, until: bytes,
               conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None,
               ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send one request (on ``conn``, else a new connection) and read until ``until``."""
    host = url.removeprefix("http://")
    if conn is None:
        h, p = host.rsplit(":", 1)
        conn = await asyncio.open_connection(h, int(p))
    conn[1].write(_request(host))
    await _read_until(conn[0], until)
    return conn


async def _read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    got = b""
    async with asyncio.timeout(10):
        while marker not in got:
            data = await reader.read(65536)
            assert data, got
            got += data
    return got


async def test_leaving_right_after_done_is_ok_not_cancelled() -> None:
    chunks = [*openai_chunks(["Hi", " there", "!"]), b""]  # b"": a 300 ms wait, no bytes
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=SSE, gap_s=0.3)
        async with running_proxy(up.url, inject_usage=False) as (_, url, recs):
            # 1st request: read it whole (through the terminator), keeping the connection
            conn = await _ask(url, b"0\r\n\r\n")
            # 2nd request on the same connection (the direct path): leave after [DONE]
            (await _ask(url, b"data: [DONE]", conn))[1].close()
            # a new connection (aiohttp's handler path): leave after [DONE] as well
            (await _ask(url, b"data: [DONE]"))[1].close()
            records = await recs.wait(3, within_s=10)
    assert [r.outcome for r in records] == ["ok", "ok", "ok"], [
        (r.outcome, r.error) for r in records]
    for r in records:
        assert r.error is None and r.completion_tokens == 3 and len(r.chunk_offsets_s) == 3
        assert r.tpot_s() is not None and r.e2e_s >= r.chunk_offsets_s[-1]


async def test_leaving_before_done_is_still_cancelled() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["Hi", " there", "!"]), headers=SSE,
                           gap_s=0.3)
        async with running_proxy(up.url, inject_usage=False) as (_, url, recs):
            (await _ask(url, b'"Hi"'))[1].close()
            (rec,) = await recs.wait(1, within_s=10)
    assert rec.outcome == "cancelled" and rec.error == "client disconnected"


def test_every_stream_dialect_knows_its_end_marker() -> None:
    from llmtop.proxy.dialects.anthropic import AnthropicStreamParser
    from llmtop.proxy.dialects.ollama import OllamaStreamParser
    from llmtop.proxy.dialects.openai import OpenAIStreamParser
    from llmtop.proxy.dialects.tgi import TGIStreamParser

    cases = [
        (OpenAIStreamParser(), b"".join(openai_chunks(["a"])[:-1]), b"data: [DONE]\n\n"),
        (AnthropicStreamParser(),
         b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
         b'"delta":{"type":"text_delta","text":"a"}}\n\n',
         b'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
        (OllamaStreamParser(), b'{"model":"m","response":"a","done":false}\n',
         b'{"model":"m","response":"","done":true,"eval_count":1}\n'),
        (TGIStreamParser(),
         b'data: {"token":{"id":1,"text":"a","special":false},"generated_text":null,'
         b'"details":null}\n\n',
         b'data: {"token":{"id":2,"text":"","special":true},"generated_text":"a",'
         b'"details":{"generated_tokens":1}}\n\n'),
    ]
    for parser, body, end in cases:
        parser.feed(body)
        assert not parser.ended, type(parser).__name__
        parser.feed(end)
        assert parser.ended, type(parser).__name__
