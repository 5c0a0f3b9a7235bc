"""The proxy is invisible: same bytes, same chunking, same status and headers, for every
dialect, streaming and not, through raw aiohttp clients and the openai SDK."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict
from test_proxy_support import (
    Script,
    openai_chunks,
    read_chunks,
    running_proxy,
    scripted_upstream,
    sha,
    sse,
)
from yarl import URL

FIXTURES = Path("/work/shared/fixtures/llamacpp")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _anthropic() -> list[bytes]:
    def ev(name: str, obj: dict[str, Any]) -> bytes:
        return f"event: {name}\n".encode() + sse(obj)

    return [
        ev("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-t",
            "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
        ev("ping", {"type": "ping"}),
        ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "Hello"}}),
        ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": " there"}}),
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                             "usage": {"output_tokens": 4}}),
        ev("message_stop", {"type": "message_stop"}),
    ]


def _ollama() -> list[bytes]:
    def line(obj: dict[str, Any]) -> bytes:
        return json.dumps(obj).encode() + b"\n"

    msgs = [line({"model": "llama3", "message": {"role": "assistant", "content": t},
                  "done": False}) for t in ("Hel", "lo", "!")]
    msgs.append(line({"model": "llama3", "message": {"role": "assistant", "content": ""},
                      "done": True, "done_reason": "stop", "prompt_eval_count": 6,
                      "eval_count": 3}))
    return msgs


def _tgi() -> list[bytes]:
    out = []
    for i, t in enumerate(("Hel", "lo")):
        out.append(b"data:" + json.dumps({"index": i + 1, "token": {
            "id": i, "text": t, "logprob": -0.1, "special": False},
            "generated_text": None, "details": None}).encode() + b"\n\n")
    out.append(b"data:" + json.dumps({"index": 3, "token": {
        "id": 2, "text": "!", "logprob": -0.1, "special": False},
        "generated_text": "Hello!", "details": {"finish_reason": "length",
                                                 "generated_tokens": 3}}).encode() + b"\n\n")
    return out


# (client path, request body, upstream chunks, response headers, expected dialect, tokens)
STREAMS: dict[str, tuple[str, dict[str, Any], list[bytes], dict[str, str], str, int]] = {
    "openai-chat": (
        "/v1/chat/completions",
        {"model": "m1", "stream": True, "stream_options": {"include_usage": True},
         "messages": [{"role": "user", "content": "hi"}]},
        openai_chunks(["Hel", "lo", " you"], usage={"prompt_tokens": 3,
                                                     "completion_tokens": 5,
                                                     "total_tokens": 8}),
        SSE_HEADERS, "openai", 5),
    "openai-llamacpp-fixture": (
        "/v1/chat/completions",
        {"model": "smollm2", "stream": True, "stream_options": {"include_usage": True},
         "messages": [{"role": "user", "content": "hi"}]},
        [b for b in (FIXTURES / "chat_stream_usage.sse").read_bytes().split(b"\n\n") if b],
        SSE_HEADERS, "openai", 12),
    "anthropic": ("/v1/messages", {"model": "claude-t", "stream": True, "max_tokens": 8,
                                   "messages": [{"role": "user", "content": "hi"}]},
                  _anthropic(), SSE_HEADERS, "anthropic", 4),
    "ollama": ("/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": "x"}]},
               _ollama(), {"Content-Type": "application/x-ndjson"}, "ollama", 3),
    "tgi": ("/generate_stream", {"inputs": "x", "parameters": {"max_new_tokens": 3}},
            _tgi(), SSE_HEADERS, "tgi", 3),
    "other": ("/v1/some/new/api", {"x": 1, "stream": True},
              [b"part one, ", b"part two, ", b"the end"],
              {"Content-Type": "text/plain"}, "other", 0),
}


def _refix(chunks: list[bytes], name: str) -> list[bytes]:
    # the llama.cpp fixture split on blank lines: put each event's blank line back
    return [c + b"\n\n" for c in chunks] if name == "openai-llamacpp-fixture" else chunks


@pytest.mark.parametrize("name", list(STREAMS))
async def test_stream_bytes_and_chunks_pass_through_unchanged(name: str) -> None:
    path, body, chunks, headers, dialect, tokens = STREAMS[name]
    chunks = _refix(chunks, name)
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=headers, gap_s=0.015)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + path, json=body) as r:
                assert r.status == 200
                assert r.headers["Content-Type"] == headers["Content-Type"]
                assert r.headers["X-Accel-Buffering"] == "no"
                got = await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert sha(got) == sha(up.sent[0])
    assert got == up.sent[0], "chunks out must equal chunks in"
    assert json.loads(up.seen[0].body) == body
    assert rec.dialect == dialect and rec.outcome == "ok" and rec.stream
    assert rec.status == 200 and rec.path == path
    if tokens:
        assert rec.completion_tokens == tokens and rec.token_source == "usage"
        assert sum(rec.chunk_tokens) == tokens
    else:  # other: timed as a plain request, first byte = first "token"
        assert rec.completion_tokens is None and len(rec.chunk_offsets_s) == 1
    assert rec.ttft_s is not None and 0 < rec.ttft_s <= rec.e2e_s


@pytest.mark.parametrize("name", list(STREAMS))
async def test_non_streaming_body_passes_through_with_its_length(name: str) -> None:
    path, body, _, _, dialect, _ = STREAMS[name]
    payload = json.dumps({"id": "x", "model": "m1", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi there"},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 2, "completion_tokens": 3,
                                              "total_tokens": 5}}).encode()
    async with scripted_upstream() as up:
        up.script = Script(chunks=[payload], content_length=True,
                           headers={"Content-Type": "application/json", "X-Upstream": "1"})
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + path, json={**body, "stream": False}) as r:
                got = await r.read()
                assert r.headers["Content-Length"] == str(len(payload))
                assert "Transfer-Encoding" not in r.headers
                assert r.headers["X-Upstream"] == "1"
                assert "X-Accel-Buffering" not in r.headers
            (rec,) = await recs.wait(1)
    assert got == payload
    assert rec.dialect == dialect and not rec.stream and rec.outcome == "ok"
    if dialect == "openai":
        assert rec.completion_tokens == 3 and rec.prompt_tokens == 2
        assert rec.token_source == "usage" and rec.model == "m1"
        assert rec.ttft_s is not None


async def test_headers_hop_by_hop_removed_host_rewritten_credentials_untouched() -> None:
    async with scripted_upstream() as up:
        resp_headers: CIMultiDict[str] = CIMultiDict(
            [("Content-Type", "application/json"), ("Set-Cookie", "a=1"),
             ("Set-Cookie", "b=2"), ("X-Request-Id", "r-1"), ("Keep-Alive", "timeout=5")])
        up.script = Script(chunks=[b"{}"], headers=resp_headers)
        async with running_proxy(up.url + "/prefix/") as (_, url, _recs), \
                aiohttp.ClientSession(skip_auto_headers=("User-Agent", "Accept-Encoding")) as s:
            sent = [("Authorization", "Bearer sk-secret-1"), ("x-api-key", "k-2"),
                    ("Connection", "keep-alive, X-Hop"), ("X-Hop", "drop me"),
                    ("Keep-Alive", "timeout=3"), ("TE", "trailers"),
                    ("Proxy-Authorization", "Basic zzz"), ("X-Custom", "a"),
                    ("X-Custom", "b"), ("Accept", "application/json")]
            target = URL(url + "/v1/models?limit=2&x=%2F&y=a%20b", encoded=True)
            async with s.get(target, headers=CIMultiDict(sent)) as r:
                assert r.status == 200
                assert r.headers.getall("Set-Cookie") == ["a=1", "b=2"]
                assert r.headers["X-Request-Id"] == "r-1"
                assert "Keep-Alive" not in r.headers
                assert await r.read() == b"{}"
    seen = up.seen[0]
    got = CIMultiDict(seen.headers)
    assert seen.method == "GET" and seen.path_qs == "/prefix/v1/models?limit=2&x=%2F&y=a%20b"
    assert got["Host"] == up.url.removeprefix("http://")
    assert got["Authorization"] == "Bearer sk-secret-1" and got["x-api-key"] == "k-2"
    assert got.getall("X-Custom") == ["a", "b"] and got["Accept"] == "application/json"
    for hop in ("X-Hop", "Keep-Alive", "TE", "Proxy-Authorization", "Transfer-Encoding"):
        assert hop not in got, hop
    # the proxy adds no headers of its own to the request
    assert "User-Agent" not in got and "Accept-Encoding" not in got


async def test_gzip_body_passes_through_compressed_and_is_timed_as_other() -> None:
    raw = b"".join(openai_chunks(["a", "b"]))
    gz = gzip.compress(raw)
    async with scripted_upstream() as up:
        up.script = Script(chunks=[gz[:20], gz[20:]], gap_s=0.01,
                           headers={"Content-Type": "text/event-stream",
                                    "Content-Encoding": "gzip"})
        async with running_proxy(up.url) as (_, url, recs), \
                aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(url + "/v1/chat/completions", json={
                    "model": "m", "stream": True,
                    "stream_options": {"include_usage": True}}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                got = await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert b"".join(got) == gz and gzip.decompress(b"".join(got)) == raw
    assert rec.outcome == "ok" and rec.token_source == "chunks"
    assert len(rec.chunk_offsets_s) == 1  # first byte only: compressed bytes are not parsed


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
async def test_every_method_is_forwarded(method: str) -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"done"], status=201, headers={"Content-Type": "text/plain"})
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.request(method, url + "/files/7", data=b"payload") as r:
                assert r.status == 201 and await r.read() == b"done"
            if method in ("PUT", "PATCH"):
                (rec,) = await recs.wait(1)
                assert rec.dialect == "other" and rec.status == 201 and rec.outcome == "ok"
    assert up.seen[0].method == method and up.seen[0].body == b"payload"
    if method in ("DELETE", "OPTIONS"):  # not a generation: forwarded, not measured
        assert not recs.items


async def test_gets_are_forwarded_but_not_measured() -> None:
    """A model list, a health check or the engine's /metrics through the proxy must not
    enter the latency figures (a 1 ms GET every second would pull TTFT p50 down)."""
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b'{"data": []}'], headers={"Content-Type": "application/json"})
        up.by_path["/v1/chat/completions"] = Script(chunks=[b"{}"], headers={
            "Content-Type": "application/json"})
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            for path in ("/v1/models", "/health", "/metrics"):
                async with s.get(url + path) as r:
                    assert r.status == 200 and await r.read() == b'{"data": []}'
                assert not proxy.active
            async with s.post(url + "/v1/chat/completions", json={"model": "m"}) as r:
                assert r.status == 200
            (rec,) = await recs.wait(1)
    assert [x.method for x in up.seen] == ["GET", "GET", "GET", "POST"]
    assert rec.path == "/v1/chat/completions"


async def test_head_request_keeps_length_and_sends_no_body() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"0123456789"], content_length=True,
                           headers={"Content-Type": "text/plain"})
        async with running_proxy(up.url) as (_, url, _recs), aiohttp.ClientSession() as s:
            async with s.head(url + "/file") as r:
                assert r.status == 200 and r.headers["Content-Length"] == "10"
                assert await r.read() == b""
            async with s.get(url + "/file") as r:  # the connection is still usable
                assert await r.read() == b"0123456789"


async def test_expect_100_continue_upload() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"ok"], headers={"Content-Type": "text/plain"})
        async with running_proxy(up.url) as (_, url, _recs), aiohttp.ClientSession() as s, \
                s.post(url + "/upload", data=b"x" * 5000, expect100=True) as r:
            assert r.status == 200 and await r.read() == b"ok"
    assert up.seen[0].body == b"x" * 5000
    assert "Expect" not in CIMultiDict(up.seen[0].headers)


def _usage_stream() -> list[bytes]:
    return openai_chunks(["Hello", ",", " world"],
                         usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7})


async def test_openai_sdk_async_stream_and_raw_bytes() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=_usage_stream(), headers=SSE_HEADERS, gap_s=0.005)
        async with running_proxy(up.url) as (_, url, recs):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": "hi"}], stream=True,
                    stream_options={"include_usage": True})
                texts, usage = [], None
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        texts.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        usage = chunk.usage
                assert "".join(texts) == "Hello, world"
                assert usage is not None and usage.completion_tokens == 3
                async with client.chat.completions.with_streaming_response.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}], stream=True,
                        stream_options={"include_usage": True}) as raw:
                    got = [b async for b in raw.iter_bytes()]
            finally:
                await client.close()
            recs_ = await recs.wait(2)
    assert sha(got) == sha(up.sent[1])
    assert all(r.outcome == "ok" and r.completion_tokens == 3 for r in recs_)
    assert recs_[0].user.startswith("key:") and "sk-test" not in recs_[0].user


async def test_openai_sdk_sync_stream_and_non_stream() -> None:
    payload = json.dumps({"id": "c1", "object": "chat.completion", "created": 1,
                          "model": "m1", "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "Hi!"}}],
                          "usage": {"prompt_tokens": 2, "completion_tokens": 2,
                                    "total_tokens": 4}}).encode()

    def respond(seen: Any) -> Script:
        if json.loads(seen.body).get("stream"):
            return Script(chunks=_usage_stream(), headers=SSE_HEADERS, gap_s=0.005)
        return Script(chunks=[payload], content_length=True)

    async with scripted_upstream() as up:
        up.responder = respond
        async with running_proxy(up.url) as (_, url, recs):
            def work() -> tuple[str, str, bytes]:
                client = openai.OpenAI(base_url=url + "/v1", api_key="sk-sync", max_retries=0)
                with client:
                    stream = client.chat.completions.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}], stream=True,
                        stream_options={"include_usage": True})
                    text = "".join(c.choices[0].delta.content or "" for c in stream
                                   if c.choices)
                    one = client.chat.completions.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}])
                    raw = client.chat.completions.with_raw_response.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}])
                    return text, one.choices[0].message.content or "", raw.content

            text, whole, raw = await asyncio.to_thread(work)
            recs_ = await recs.wait(3)
    assert text == "Hello, world" and whole == "Hi!" and raw == payload
    assert [r.stream for r in recs_] == [True, False, False]
    assert all(r.outcome == "ok" and r.token_source == "usage" for r in recs_)


async def test_an_error_page_is_not_a_first_token() -> None:
    """A 404 from a path llmtop does not know has no TTFT and no chunk, like an error in
    every known dialect; a 200 from it is timed to its first byte."""
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"<h1>Not Found</h1>"], status=404,
                           headers={"Content-Type": "text/html"})
        up.by_path["/generate-ok"] = Script(chunks=[b"some text"],
                                            headers={"Content-Type": "text/plain"})
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + "/generat", data=b"{}") as r:
                assert r.status == 404 and await r.read() == b"<h1>Not Found</h1>"
            async with s.post(url + "/generate-ok", data=b"{}") as r:
                assert await r.read() == b"some text"
            missing, ok = await recs.wait(2)
    assert missing.dialect == "other" and missing.outcome == "error" and missing.status == 404
    assert missing.ttft_s is None and missing.chunk_offsets_s == ()
    assert ok.outcome == "ok" and ok.ttft_s is not None and len(ok.chunk_offsets_s) == 1


async def test_a_websocket_upgrade_is_a_clear_501_not_a_502() -> None:
    """llmtop relays HTTP exchanges, not upgraded connections: a WebSocket handshake (the
    OpenAI Realtime API's) gets an honest 501 naming the reason instead of the upstream's
    101 being mistaken for an interim reply (QA: '502 upstream closed the connection')."""
    async with scripted_upstream() as up, running_proxy(up.url) as (proxy, url, recs):
        host, port = url.removeprefix("http://").split(":")
        async with aiohttp.ClientSession() as s, s.post(url + "/warm", data=b"x") as r:
            await r.read()  # an idle upstream connection: a whole request could go direct
        await recs.wait(1)
        for _ in range(2):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                         b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            got = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert got.startswith(b"HTTP/1.1 501"), got[:80]
            assert b'"llmtop: protocol upgrades are not relayed (websocket): connect' in got
            assert b"upgrade_not_supported" in got
        assert proxy.direct_starts == 0
    assert [x.path_qs for x in up.seen] == ["/warm"] and len(recs.items) == 1
