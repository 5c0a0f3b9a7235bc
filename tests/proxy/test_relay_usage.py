"""inject_usage: ask OpenAI-style upstreams for usage, hide it from clients that did not."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
from test_proxy_support import (
    Script,
    Seen,
    openai_chunks,
    read_chunks,
    running_proxy,
    scripted_upstream,
)

SSE = {"Content-Type": "text/event-stream"}
USAGE = {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
CHAT = "/v1/chat/completions"


def _stream(seen: Seen) -> Script:
    """Like an engine: a usage chunk only when the request asked for it."""
    body = json.loads(seen.body)
    wants = (body.get("stream_options") or {}).get("include_usage") is True
    return Script(chunks=openai_chunks(["one", " two", " three"], usage=USAGE if wants else None),
                  headers=SSE, gap_s=0.005)


async def test_client_without_usage_sees_no_usage_chunk_and_record_has_usage() -> None:
    body = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    raw_body = json.dumps(body).encode()
    async with scripted_upstream() as up:
        up.responder = _stream
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, data=raw_body,
                              headers={"Content-Type": "application/json"}) as r:
                got = await read_chunks(r)
                assert "Content-Length" not in r.headers
            (rec,) = await recs.wait(1)
    sent_up = up.seen[0].body
    assert json.loads(sent_up) == {**body, "stream_options": {"include_usage": True}}
    # only the option was spliced in: every byte of the client's body is still there
    assert sent_up.replace(b'"stream_options":{"include_usage":true},', b"") == raw_body
    usage_chunk = up.sent[0][-2]
    assert b'"usage"' in usage_chunk
    assert b"".join(got) == b"".join(c for c in up.sent[0] if c is not usage_chunk)
    assert got == [c for c in up.sent[0] if c is not usage_chunk]
    assert rec.token_source == "usage" and rec.completion_tokens == 9
    assert rec.prompt_tokens == 4 and sum(rec.chunk_tokens) == 9
    assert len(rec.chunk_offsets_s) == 3


async def test_client_with_usage_gets_it_byte_exact() -> None:
    body = {"model": "m1", "stream": True, "stream_options": {"include_usage": True},
            "messages": []}
    async with scripted_upstream() as up:
        up.responder = _stream
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            raw = json.dumps(body).encode()
            async with s.post(url + CHAT, data=raw) as r:
                got = await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert up.seen[0].body == raw
    assert got == up.sent[0] and b'"usage"' in got[-2]
    assert rec.token_source == "usage" and rec.completion_tokens == 9


async def test_openai_sdk_without_usage_sees_no_usage() -> None:
    async with scripted_upstream() as up:
        up.responder = _stream
        async with running_proxy(up.url) as (_, url, recs):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": "x"}], stream=True)
                chunks = [c async for c in stream]
            finally:
                await client.close()
            (rec,) = await recs.wait(1)
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)  # no choices=[] usage-only chunk reached the SDK
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "one two three"
    assert rec.token_source == "usage" and rec.completion_tokens == 9


async def test_rejecting_upstream_falls_back_and_is_remembered() -> None:
    def strict(seen: Seen) -> Script:
        body: dict[str, Any] = json.loads(seen.body)
        if "stream_options" in body:
            err = {"error": {"message": "Unrecognized request argument supplied: "
                             "stream_options", "type": "invalid_request_error"}}
            return Script(chunks=[json.dumps(err).encode()], status=400, content_length=True)
        return _stream(seen)

    body = {"model": "m1", "stream": True, "messages": []}
    async with scripted_upstream() as up:
        up.responder = strict
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(url + CHAT, json=body) as r:
                    assert r.status == 200
                    got = await read_chunks(r)
                    assert b"".join(got).count(b'"content"') == 4
            recs_ = await recs.wait(2)
            assert proxy.usage_rejected
    # first request: tried with the option, then without; second: without at once
    assert ["stream_options" in json.loads(x.body) for x in up.seen] == [True, False, False]
    assert all(r.outcome == "ok" and r.status == 200 for r in recs_)
    assert all(r.token_source == "chunks" and r.completion_tokens == 3 for r in recs_)


async def test_other_400_is_forwarded_not_retried() -> None:
    err = json.dumps({"error": {"message": "model 'zzz' not found", "type": "not_found"}})
    async with scripted_upstream() as up:
        up.script = Script(chunks=[err.encode()], status=400, content_length=True)
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, json={"model": "zzz", "stream": True}) as r:
                assert r.status == 400 and await r.read() == err.encode()
                assert r.headers["Content-Length"] == str(len(err))
            (rec,) = await recs.wait(1)
            assert not proxy.usage_rejected
    assert len(up.seen) == 1
    assert rec.outcome == "error" and rec.status == 400 and "400" in (rec.error or "")


async def test_inject_usage_off_sends_the_body_unchanged() -> None:
    async with scripted_upstream() as up:
        up.responder = _stream
        async with running_proxy(up.url, inject_usage=False) as (_, url, recs), \
                aiohttp.ClientSession() as s:
            raw = json.dumps({"model": "m1", "stream": True}).encode()
            async with s.post(url + CHAT, data=raw) as r:
                got = await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert up.seen[0].body == raw and got == up.sent[0]
    assert rec.token_source == "chunks" and rec.completion_tokens == 3


async def test_stripped_stream_sent_with_content_length_loses_it() -> None:
    def fixed(seen: Seen) -> Script:
        sc = _stream(seen)
        sc.content_length = True
        return sc

    async with scripted_upstream() as up:
        up.responder = fixed
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, json={"model": "m1", "stream": True}) as r:
                assert "Content-Length" not in r.headers
                data = await r.read()
            (rec,) = await recs.wait(1)
    assert b'"usage"' not in data and data.endswith(b"data: [DONE]\n\n")
    assert rec.completion_tokens == 9 and rec.outcome == "ok"


async def test_client_stream_options_without_usage_are_merged_not_duplicated() -> None:
    body = {"model": "m1", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    async with scripted_upstream() as up:
        up.responder = _stream
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, json=body) as r:
                data = await r.read()
            (rec,) = await recs.wait(1)
    sent = up.seen[0].body
    assert sent.count(b'"stream_options"') == 1
    assert json.loads(sent)["stream_options"] == {"continuous_usage_stats": False,
                                                   "include_usage": True}
    assert b'"usage"' not in data and rec.token_source == "usage"
