"""A record's ``upstream_id`` is the id the client itself saw — the body's ``chatcmpl-…``
or ``msg_…``, or SGLang's ``meta_info.id``, from ``llmtop sim``, streamed or not, served
directly or through aiohttp's path — unless the response has an ``X-Request-Id``: then
that header (the engine's id in its logs, vLLM ``--enable-request-id-headers``, OpenAI).
An open request's live row shows it as soon as the head or the stream has named it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
import pytest
from engine_ids import seen_id
from test_proxy_direct import _hostport, _read_response
from test_proxy_support import (
    Records,
    Script,
    openai_chunks,
    running_proxy,
    scripted_upstream,
)

from llmtop.proxy.server import ProxyServer
from llmtop.sim.server import running_sim

MESSAGES = [{"role": "user", "content": "hello there"}]
CASES = {
    "openai stream": ("/v1/chat/completions", {"model": "m", "max_tokens": 4, "stream": True,
                                               "messages": MESSAGES}),
    "openai json": ("/v1/chat/completions", {"model": "m", "max_tokens": 4,
                                             "messages": MESSAGES}),
    "anthropic stream": ("/v1/messages", {"model": "claude-x", "max_tokens": 4,
                                          "stream": True, "messages": MESSAGES}),
    "anthropic json": ("/v1/messages", {"model": "claude-x", "max_tokens": 4,
                                        "messages": MESSAGES}),
    # SGLang's native API: the id is meta_info.id
    "sglang stream": ("/generate", {"text": "hello there", "stream": True,
                                    "sampling_params": {"max_new_tokens": 4}}),
    "sglang json": ("/generate", {"text": "hello there",
                                  "sampling_params": {"max_new_tokens": 4}}),
}
PREFIX = {"openai": "chatcmpl-", "anthropic": "msg_", "sglang": "sglang-"}
"""The simulator's ids, per API (``llmtop.sim.handlers``)."""


def _raw(path: str, body: dict[str, Any], extra: bytes = b"") -> bytes:
    data = json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: h\r\n"
            b"Content-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(data) + data)


class Client:
    """Two keep-alive connections to the proxy: on ``whole`` each request goes in one write
    (served directly once an upstream connection is idle), on ``split`` head and body in
    two reads (aiohttp's path; such a connection is never served directly again)."""

    def __init__(self, proxy: ProxyServer, recs: Records) -> None:
        self.proxy, self.recs = proxy, recs
        self.conns: dict[bool, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def open(self, url: str) -> Client:
        for direct in (True, False):
            self.conns[direct] = await asyncio.open_connection(*_hostport(url))
        return self

    def close(self) -> None:
        for _, writer in self.conns.values():
            writer.close()

    async def send(self, raw: bytes, direct: bool, status: bytes = b"200") -> bytes:
        """One request, once the one before it has its record (its upstream connection is
        idle again); the body the client read."""
        recs, proxy = self.recs, self.proxy
        recs.bus.drain()
        n = len(recs.items)
        before = proxy.direct_starts
        reader, writer = self.conns[direct]
        if direct:
            writer.write(raw)
        else:
            split = raw.index(b"\r\n\r\n") + 4
            writer.write(raw[:split])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(raw[split:])
        body = await _read_response(reader, status)
        await recs.wait(n + 1)
        assert proxy.direct_starts == before + direct
        return body


async def test_the_record_names_the_id_the_client_saw_on_both_paths() -> None:
    async with running_sim("tiny") as sim, running_proxy(sim.url) as (proxy, url, recs):
        client = await Client(proxy, recs).open(url)
        seen: list[tuple[str, bool, str]] = []
        try:
            # a first request leaves an upstream connection idle (aiohttp's path: none was
            # idle yet); then each case whole (direct) and split (aiohttp's path)
            await client.send(_raw(*CASES["openai json"]), False)
            for name, (path, body) in CASES.items():
                for direct in (True, False):
                    got = await client.send(_raw(path, body), direct)
                    seen.append((name, direct, seen_id(got)))
        finally:
            client.close()
        records = (await recs.wait(1 + len(seen)))[1:]
    assert len(records) == len(seen) == 2 * len(CASES)
    for (name, direct, rid), rec in zip(seen, records, strict=True):
        assert rec.outcome == "ok" and rec.stream == name.endswith("stream"), (name, rec)
        assert rec.dialect == name.split()[0], (name, rec)
        assert rid.startswith(PREFIX[rec.dialect]), (name, rid)
        assert rec.upstream_id == rid, (name, direct, rec)
    assert len({rid for _, _, rid in seen}) == len(seen)  # each request its own


async def test_the_openai_sdks_stream_id_is_the_records() -> None:
    async with running_sim("tiny") as sim, running_proxy(sim.url) as (_, url, recs):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=4, stream=True)  # type: ignore[arg-type]
            ids = {chunk.id async for chunk in stream}
            done = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        finally:
            await client.close()
        records = await recs.wait(2)
    assert len(ids) == 1
    assert [r.upstream_id for r in records] == [ids.pop(), done.id]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "aiohttp"])
async def test_x_request_id_is_taken_before_the_bodys_id(direct: bool) -> None:
    async with scripted_upstream() as up:
        up.by_path["/v1/chat/completions"] = Script(
            chunks=openai_chunks(["a", "b"]),
            headers={"Content-Type": "text/event-stream", "x-REQUEST-id": "vllm-req-42"})
        up.by_path["/v1/completions"] = Script(chunks=openai_chunks(["a"]),
                                               headers={"Content-Type": "text/event-stream"})
        up.by_path["/v1/messages"] = Script(
            chunks=[b'{"type":"error","error":{"type":"overloaded_error","message":"busy"}}'],
            status=529, content_length=True,
            headers={"Content-Type": "application/json", "X-Request-Id": "req_err_1"})
        body = {"model": "m1", "stream": True, "messages": MESSAGES}
        async with running_proxy(up.url) as (proxy, url, recs):
            client = await Client(proxy, recs).open(url)
            try:
                await client.send(_raw("/v1/completions", body), False)
                got = await client.send(_raw("/v1/chat/completions", body), direct)
                await client.send(_raw("/v1/messages", {**body, "model": "claude-x"}), direct,
                                  b"529")
            finally:
                client.close()
            plain, headed, failed = await recs.wait(3)
    assert seen_id(got) == "chatcmpl-1"  # the body's id reached the client as it was
    assert plain.upstream_id == "chatcmpl-1"  # no header: the body's id
    assert headed.upstream_id == "vllm-req-42"  # the header wins
    # a failed answer keeps the engine's id too: the one to look up in its logs
    assert (failed.status, failed.outcome, failed.upstream_id) == (529, "error", "req_err_1")


async def test_an_open_requests_row_shows_the_id_once_named() -> None:
    """The live row (``/requests?state=active``): the header's id from the head on, the
    body's id once the first event has come."""
    async with scripted_upstream() as up:
        up.by_path["/v1/chat/completions"] = Script(
            chunks=openai_chunks(["a", "b", "c"]), gap_s=0.4,
            headers={"Content-Type": "text/event-stream", "X-Request-Id": "req-live"})
        up.by_path["/v1/completions"] = Script(
            chunks=openai_chunks(["a", "b", "c"]), gap_s=0.4,
            headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (proxy, url, recs):

            async def row_id(path: str) -> Any:
                row, _ = await _first_chunk_row(proxy, url, path)
                return row["upstream_id"]

            live = [await row_id("/v1/chat/completions"), await row_id("/v1/completions")]
            records = await recs.wait(2)
    assert live == ["req-live", "chatcmpl-1"]
    assert [r.upstream_id for r in records] == live


async def _post(url: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(*_hostport(url))
    try:
        writer.write(_raw(path, body or {"model": "m1", "stream": True,
                                         "messages": MESSAGES}))
        return await _read_response(reader)
    finally:
        writer.close()


async def _first_chunk_row(proxy: ProxyServer, url: str, path: str,
                           body: dict[str, Any] | None = None) -> tuple[dict[str, Any], bytes]:
    """Post ``body`` to ``path`` and take the open request's row once its first chunk has
    come (the live view an operator reads mid-stream); then the answer the client read."""
    client = asyncio.create_task(_post(url, path, body))
    deadline = time.monotonic() + 5
    while True:
        rows = [a.to_json_dict(time.perf_counter_ns()) for a in list(proxy.active.values())]
        if rows and rows[0]["chunks"] >= 1:
            break
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.01)
    return rows[0], await client


def _sglang_events(rid: str, n: int) -> list[bytes]:
    """An SGLang ``/generate`` stream as SGLang writes it: the output so far in each event,
    ``meta_info.id`` its rid, then ``[DONE]``."""
    out = []
    for k in range(1, n + 1):
        meta = {"id": rid, "finish_reason": {"type": "length", "length": n} if k == n else None,
                "prompt_tokens": 3, "weight_version": "default", "completion_tokens": k,
                "cached_tokens": 0}
        out.append(b"data: " + json.dumps({"text": "a" * k, "output_ids": list(range(k)),
                                           "meta_info": meta},
                                          separators=(",", ":")).encode() + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


async def test_an_sglang_answers_meta_info_id_is_the_live_rows_and_the_records() -> None:
    """An upstream answering like SGLang's ``/generate``: the open request's row names its
    ``meta_info.id`` once the first event has come, and so does its record; with an
    ``X-Request-Id`` the header's id is taken instead."""
    async with scripted_upstream() as up:
        up.responder = lambda seen: Script(
            chunks=_sglang_events("e1a5c0ffee", 3), gap_s=0.4,
            headers={"Content-Type": "text/event-stream",
                     **({"X-Request-Id": "hdr-7"} if b'"header"' in seen.body else {})})
        async with running_proxy(up.url) as (proxy, url, recs):

            async def row_id(body: dict[str, Any]) -> tuple[Any, bytes]:
                row, got = await _first_chunk_row(proxy, url, "/generate", body)
                return row["upstream_id"], got

            body = {"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 3}}
            live, got = await row_id(body)
            headed, _ = await row_id({**body, "rid": "header"})
            records = await recs.wait(2)
    assert seen_id(got) == "e1a5c0ffee"  # what the client read
    assert (live, headed) == ("e1a5c0ffee", "hdr-7")
    assert [(r.dialect, r.completion_tokens, r.upstream_id) for r in records] == [
        ("sglang", 3, "e1a5c0ffee"), ("sglang", 3, "hdr-7")]
