"""SGLang's native ``/generate`` through the proxy, against ``llmtop sim`` and its ground
truth: the client gets the engine's bytes, the record's TTFT and chunk times are
consistent with what the client and the engine saw, its tokens are the engine's, a client
that leaves is recorded ``cancelled``, and the simulator's faults become the right
outcomes. TGI's ``/generate`` on the same path stays TGI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from test_proxy_support import Records, dechunk, running_proxy

from llmtop.events import RequestRecord
from llmtop.proxy.dialects.registry import make_parser
from llmtop.sim.server import running_sim


def body(max_new: int, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"text": "The capital of France is", "stream": stream,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0}, **extra}


@contextlib.asynccontextmanager
async def _tap(upstream: str) -> AsyncIterator[tuple[str, bytearray]]:
    """A TCP relay in front of ``upstream`` that keeps every byte ``upstream`` sent back:
    what the engine wrote on the wire, to compare with what the client got."""
    host, port = upstream.removeprefix("http://").split(":")
    wire = bytearray()
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bool) -> None:
        try:
            while data := await src.read(65536):
                if keep:
                    wire.extend(data)
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        for t in (pipe(reader, up_writer, False), pipe(up_reader, writer, True)):
            task = asyncio.ensure_future(t)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", wire
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _truth(s: aiohttp.ClientSession, sim_url: str) -> list[dict[str, Any]]:
    async with s.get(sim_url + "/sim/requests") as r:
        out: list[dict[str, Any]] = await r.json()
        return out


async def test_stream_records_agree_with_the_client_and_the_engine() -> None:
    """Three tokens an engine step (``stream_interval``-like): the client gets the bytes
    the engine wrote, the record counts the engine's tokens per chunk, and its times are
    consistent with the client's reads (the proxy wrote each chunk after the client sent
    the request and before the client read it) and the engine's writes."""
    async with running_sim("tiny", seed=7, tokens_per_chunk=3) as sim, \
            _tap(sim.url) as (tapped, wire), running_proxy(tapped) as (_, url, recs), \
            aiohttp.ClientSession() as s:
        parser = make_parser("sglang", True, "text/event-stream")
        reads: list[tuple[float, int]] = []  # (when, tokens) of each read with content
        got = b""
        t_send = time.perf_counter()
        async with s.post(url + "/generate", json=body(20)) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                now = time.perf_counter()
                got += data
                n, k = parser.feed(data)
                if n:
                    reads.append((now, k))
        (rec,) = await recs.wait(1)
        (truth,) = await _truth(s, sim.url)
    # the client got the engine's bytes, byte for byte: an SGLang stream ending [DONE]
    head, _, chunked = bytes(wire).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    assert dechunk(chunked) == got
    events = [json.loads(line[6:]) for line in got.split(b"\n")
              if line.startswith(b"data: {")]
    assert got.endswith(b"data: [DONE]\n\n")
    assert len(events) == len(truth["chunks"])
    assert events[-1]["meta_info"]["completion_tokens"] == truth["completion_tokens"] == 20
    assert rec.dialect == "sglang" and rec.outcome == "ok" and rec.error is None
    assert rec.stream is True and truth["stream"] is True
    assert rec.completion_tokens == 20 and rec.token_source == "usage"
    assert rec.prompt_tokens == truth["prompt_tokens"]
    # the recorded chunks carry the tokens the client counted in what it read (two writes
    # of the proxy may reach a busy client in one read: not more reads than chunks)
    assert sum(rec.chunk_tokens) == sum(k for _, k in reads) == 20
    assert 0 < len(reads) <= len(rec.chunk_offsets_s) and max(rec.chunk_tokens) >= 3
    assert rec.ttft_s is not None and rec.ttft_s == rec.chunk_offsets_s[0]
    # t0 came after the send, each write before the read that got it
    assert rec.ttft_s <= reads[0][0] - t_send
    assert rec.chunk_offsets_s[-1] <= reads[-1][0] - t_send
    # the proxy writes each chunk after the engine wrote it (5 ms: the two clocks' anchors)
    engine = truth["chunks"]
    assert len(rec.chunk_offsets_s) <= len(engine)
    assert rec.t_start + rec.chunk_offsets_s[0] >= engine[0] - 0.005
    assert rec.t_start + rec.chunk_offsets_s[-1] >= engine[-1] - 0.005


async def test_whole_answer_and_tgi_on_the_same_path() -> None:
    async with running_sim("tiny", seed=8, time_scale=0.3) as sim, \
            running_proxy(sim.url) as (_, url, recs), aiohttp.ClientSession() as s:
        async with s.post(url + "/generate", json=body(6, stream=False)) as r:
            answer = await r.json()
        async with s.post(url + "/generate",
                          json={"inputs": "hi", "parameters": {"max_new_tokens": 4}}) as r:
            tgi = await r.json()
        sg, tg = await recs.wait(2)
        truth = await _truth(s, sim.url)
    assert answer["meta_info"]["completion_tokens"] == 6 and "generated_text" in tgi
    assert (sg.dialect, sg.stream, sg.outcome, sg.token_source) == (
        "sglang", False, "ok", "usage")
    assert (sg.completion_tokens, sg.prompt_tokens) == (6, truth[0]["prompt_tokens"])
    assert (tg.dialect, tg.completion_tokens, tg.token_source) == ("tgi", 4, "usage")


async def test_client_leaving_mid_stream_is_cancelled() -> None:
    async with running_sim("tiny", seed=9) as sim, \
            running_proxy(sim.url) as (_, url, recs), aiohttp.ClientSession() as s:
        r = await s.post(url + "/generate", json=body(500))
        got = b""
        while got.count(b'"completion_tokens"') < 3:
            got += await r.content.readany()
        r.close()
        (rec,) = await recs.wait(1)
        for _ in range(200):
            (truth,) = await _truth(s, sim.url)
            if truth["cancelled_at"] is not None:
                break
            await asyncio.sleep(0.005)
    assert truth["state"] == "cancelled" and truth["completion_tokens"] < 500
    assert rec.dialect == "sglang"
    assert rec.outcome == "cancelled" and rec.error == "client disconnected"
    # the tokens the client was sent, as the engine counted them in its last event
    assert rec.token_source == "usage" and rec.completion_tokens == sum(rec.chunk_tokens) >= 3


async def _fault(url: str, fault: str, s: aiohttp.ClientSession, recs: Records,
                 n: int) -> tuple[int, bytes, RequestRecord]:
    status, data = 0, b""
    try:
        async with s.post(url + "/generate", json=body(8),
                          headers={"X-Sim-Fault": fault}) as r:
            status = r.status
            async for chunk in r.content.iter_any():
                data += chunk
    except aiohttp.ClientPayloadError:
        pass
    return status, data, (await recs.wait(n))[n - 1]


async def test_sim_faults_become_the_right_outcomes() -> None:
    async with running_sim("tiny", seed=10, time_scale=0.3) as sim, \
            running_proxy(sim.url) as (_, url, recs), aiohttp.ClientSession() as s:
        status, data, rec = await _fault(url, "status:503", s, recs, 1)
        assert status == 503 and json.loads(data)["object"] == "error"
        assert rec.outcome == "error" and rec.status == 503 and rec.dialect == "sglang"
        assert rec.error == "upstream answered HTTP 503 (503)"  # its type and code

        status, data, rec = await _fault(url, "malformed-after:2", s, recs, 2)
        assert status == 200 and data.endswith(b"data: [DONE]\n\n")
        assert rec.outcome == "error" and "malformed" in (rec.error or "")
        assert rec.completion_tokens == 8 and rec.token_source == "usage"

        status, data, rec = await _fault(url, "disconnect-after:3", s, recs, 3)
        assert status == 200 and rec.outcome == "error" and "broke" in (rec.error or "")
        assert sum(rec.chunk_tokens) == 3 == rec.completion_tokens
