"""QA of SGLang's native ``POST /generate`` through a running proxy: an SGLang-shaped
stream (cumulative ``text``, ``meta_info.completion_tokens`` counting up, a final event
with ``finish_reason``, ``data: [DONE]``) replayed by a real aiohttp upstream, split across
HTTP chunks; the record reads it as SGLang, not as TGI (which also serves ``/generate``)."""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp
from test_proxy_support import Script, read_chunks, running_proxy, scripted_upstream

SSE = {"Content-Type": "text/event-stream; charset=utf-8"}
GAP = 0.05


def sg(text: str, ids: list[int], completion: int, finish: dict[str, Any] | None = None,
       prompt: int = 7) -> bytes:
    """One SGLang ``/generate`` stream event as its http_server writes it."""
    meta: dict[str, Any] = {"id": "5e1f", "finish_reason": finish, "prompt_tokens": prompt,
                            "weight_version": "default", "completion_tokens": completion,
                            "cached_tokens": 0}
    if finish is not None:
        meta["e2e_latency"] = 0.21
    return b"data: " + json.dumps({"text": text, "output_ids": ids, "meta_info": meta},
                                  separators=(",", ":")).encode() + b"\n\n"


SGLANG_REQUEST = {"text": "The capital of France is", "stream": True,
                  "sampling_params": {"max_new_tokens": 6, "temperature": 0}}


async def test_sglang_generate_stream_is_measured_as_sglang() -> None:
    """A user running SGLang's ``sglang.bench_serving --backend sglang`` (or their own
    client) against ``/generate``: TTFT at the first event, one chunk per content event,
    tokens from ``meta_info.completion_tokens`` (engine truth: the third event carries
    three tokens, as with ``stream_interval``), prompt tokens from ``meta_info``."""
    events = [
        sg(" Paris", [12095], 1),
        sg(" Paris.", [12095, 13], 2),
        sg(" Paris. It is the", [12095, 13, 1084, 374, 279], 5),
        sg(" Paris. It is the capital", [12095, 13, 1084, 374, 279, 6722], 6,
           {"type": "length", "length": 6}),
    ]
    data = b"".join(events) + b"data: [DONE]\n\n"
    async with scripted_upstream() as up:
        up.script = Script(chunks=[*events, b"data: [DONE]\n\n"], headers=SSE, gap_s=GAP)
        async with running_proxy(up.url) as (_p, url, records), \
                aiohttp.ClientSession() as s, s.post(url + "/generate", json=SGLANG_REQUEST) as r:
            got = await read_chunks(r)
        (rec,) = await records.wait(1)
    assert b"".join(got) == data
    assert rec.outcome == "ok" and rec.error is None and rec.stream is True
    assert rec.ttft_s is not None
    assert rec.completion_tokens == 6 and rec.token_source == "usage"
    assert rec.prompt_tokens == 7
    assert len(rec.chunk_offsets_s) == 4 and rec.chunk_tokens == (1, 1, 3, 1)
    assert rec.dialect == "sglang"


async def test_both_serving_paths_tell_sglang_from_tgi_by_the_body() -> None:
    """The first request goes through aiohttp's path (the dialect is decided before the
    body is read, then again with it); the next ones on a kept-alive connection, with an
    upstream connection idle in the pool, through the direct path (decided with the body
    at once). SGLang, TGI, SGLang: each read as what it is."""
    stream = sg(" Paris", [12095], 1, {"type": "length", "length": 1}) + b"data: [DONE]\n\n"
    tgi = (b'data:{"index":1,"token":{"id":5,"text":"Hi","logprob":-0.1,"special":false},'
           b'"generated_text":"Hi","details":{"finish_reason":"length","generated_tokens":1,'
           b'"seed":null,"input_length":3}}\n\n')
    async with scripted_upstream() as up:
        up.responder = lambda seen: Script(
            chunks=[tgi if b'"inputs"' in seen.body else stream], headers=SSE)
        async with running_proxy(up.url) as (proxy, url, records), \
                aiohttp.ClientSession() as s:
            for body in (SGLANG_REQUEST, {"inputs": "x", "parameters": {}},
                         {**SGLANG_REQUEST, "rid": "second"}):
                async with s.post(url + "/generate", json=body) as r:
                    assert r.status == 200
                    await r.read()
            recs = await records.wait(3)
            direct = proxy.direct_starts
    assert [r.dialect for r in recs] == ["sglang", "tgi", "sglang"]
    assert [(r.completion_tokens, r.prompt_tokens) for r in recs] == [(1, 7), (1, 3), (1, 7)]
    assert all(r.outcome == "ok" and r.token_source == "usage" for r in recs)
    assert direct >= 1, "the direct path was not exercised"


async def test_proxy_error_for_an_sglang_request_is_read_by_sglang_clients() -> None:
    """The upstream cannot be reached: the 502 is in the shape SGLang's own errors have
    (``error.message``, where sglang.bench_serving and SGLang's clients look), and the
    record says sglang (the body was read before the answer was made)."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with running_proxy(dead) as (_p, url, records), aiohttp.ClientSession() as s, \
            s.post(url + "/generate", json=SGLANG_REQUEST) as r:
        status, answer = r.status, await r.json()
    (rec,) = await records.wait(1)
    assert status == 502 and answer["error"]["message"].startswith("llmtop: ")
    assert rec.dialect == "sglang" and rec.outcome == "error" and rec.status == 502
