"""Streams that end without the engine's usage, from an engine that packs several tokens
into one event, are counted at the rate the proxy learned from that model's complete
streams (``token_source`` ``estimate``), not one token an event.

Metric audit: a client that cancels after 7 events of 3 tokens was recorded as 7 output
tokens, not ~21 — output tokens/s and per-user totals read low exactly when users cancel.
All over real sockets: a scripted upstream (exact counts) and ``llmtop sim`` with
``tokens_per_chunk=3`` (checked against the engine's own count).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
from test_proxy_support import (
    Records,
    Script,
    Seen,
    openai_chunks,
    running_proxy,
    scripted_upstream,
)

from llmtop.config import Config
from llmtop.events import RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.proxy.server import ProxyServer
from llmtop.proxy.token_rate import TokenRates, next_rate
from llmtop.sim.server import running_sim
from llmtop.workers_wire import decode_batch, encode_batch

SSE = {"Content-Type": "text/event-stream"}
CHAT = "/v1/chat/completions"
WORDS = [f"w{i} " for i in range(12)]
"""A complete answer: 12 content events."""


def _complete(tokens_per_event: int) -> Script:
    """12 content events — the first one token (prefill's), the others ``tokens_per_event``
    each, as vLLM with a stream interval sends them — and the engine's usage, then [DONE]."""
    n = 1 + 11 * tokens_per_event
    usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
    return Script(chunks=openai_chunks(WORDS, usage=usage), headers=SSE)


def _cut(events: int, *, hang: bool = True) -> Script:
    """A role chunk and ``events`` content events, then the upstream hangs (the client will
    leave) or drops the connection (a stream broken mid-answer); no usage ever comes."""
    chunks = openai_chunks([f"x{i} " for i in range(events + 10)],
                           usage={"prompt_tokens": 5, "completion_tokens": 99,
                                  "total_tokens": 104})
    n = events + 1
    return Script(chunks=chunks, headers=SSE, gap_s=0.005,
                  hang_after=n if hang else None, break_after=None if hang else n)


def _responder(scripts: list[Script]) -> Callable[[Seen], Script]:
    """Answer the i-th request with ``scripts[i]`` (the last one from then on)."""
    served = [0]

    def answer(seen: Seen) -> Script:
        i = min(served[0], len(scripts) - 1)
        served[0] += 1
        return scripts[i]
    return answer


async def _full(s: aiohttp.ClientSession, url: str) -> None:
    body = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with s.post(url + CHAT, json=body) as r:
        assert r.status == 200
        await r.read()


async def _leave_after(url: str, events: int, agg: Aggregator | None = None) -> None:
    """Stream and close the connection once ``events`` content events were read (ticking
    ``agg`` as they come, as the TUI's tick would)."""
    body = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        r = await s.post(url + CHAT, json=body)
        got = b""
        async with asyncio.timeout(10):
            while got.count(b'"content":"x') < events:
                got += await r.content.readany()
                if agg is not None:
                    agg.tick()
        r.close()


async def _learn(proxy: ProxyServer, url: str, recs: Records, n: int) -> list[RequestRecord]:
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            await _full(s, url)
    records = await recs.wait(n)
    assert all(r.token_source == "usage" for r in records)
    return records


async def test_a_cancelled_stream_is_counted_at_the_learned_rate() -> None:
    async with scripted_upstream() as up:
        up.responder = _responder([_complete(3), _complete(3), _cut(7)])
        async with running_proxy(up.url) as (proxy, url, recs):
            await _learn(proxy, url, recs, 2)
            assert proxy.token_rates.rate("m1") == 3.0
            # a fresh aggregator sees only the cancelled request, ticked while it streams
            agg = Aggregator(Config(), proxy.active)
            recs.bus.subscribe(agg.on_events)
            await _leave_after(url, 7, agg)
            rec = (await recs.wait(3))[2]
    assert rec.outcome == "cancelled" and rec.stream
    assert len(rec.chunk_offsets_s) == 7  # 7 events forwarded, none after the client left
    assert rec.token_source == "estimate"
    assert rec.completion_tokens == 19 == sum(rec.chunk_tokens)  # 1 + 6 × 3, not 7
    assert rec.chunk_tokens == (1, 3, 3, 3, 3, 3, 3)  # the first is the first token
    # the metrics: the estimate is the request's output, and teaches no tokens per event
    assert agg.snapshot(None)["system"]["output_tokens"] == 19
    assert agg.tokens_per_event == {}
    # the --workers wire carries it to the coordinator as it is
    (back,) = decode_batch(encode_batch(1, 0, [rec], [])).events
    assert back == rec and isinstance(back, RequestRecord) and back.token_source == "estimate"
    assert json.loads(json.dumps(rec.to_json_dict()))["token_source"] == "estimate"


async def test_a_stream_broken_mid_answer_is_estimated_too() -> None:
    async with scripted_upstream() as up:
        up.responder = _responder([_complete(3), _cut(5, hang=False)])
        async with running_proxy(up.url) as (proxy, url, recs):
            await _learn(proxy, url, recs, 1)
            async with aiohttp.ClientSession() as s:
                body = {"model": "m1", "stream": True,
                        "messages": [{"role": "user", "content": "hi"}]}
                async with s.post(url + CHAT, json=body) as r:
                    try:
                        await r.read()
                    except aiohttp.ClientPayloadError:
                        pass
            rec = (await recs.wait(2))[1]
    assert rec.outcome == "error" and "broke" in (rec.error or "")
    assert rec.token_source == "estimate" and rec.completion_tokens == 13  # 1 + 4 × 3
    assert rec.chunk_tokens == (1, 3, 3, 3, 3)


async def test_without_a_learned_rate_it_stays_one_token_an_event() -> None:
    async with scripted_upstream() as up:
        up.responder = _responder([_cut(7)])
        async with running_proxy(up.url) as (proxy, url, recs):
            await _leave_after(url, 7)
            (rec,) = await recs.wait(1)
            assert proxy.token_rates.rate("m1") is None
    assert rec.outcome == "cancelled"
    assert rec.token_source == "chunks" and rec.completion_tokens == 7
    assert rec.chunk_tokens == (1,) * 7


async def test_a_one_token_an_event_engine_stays_chunks() -> None:
    async with scripted_upstream() as up:
        up.responder = _responder([_complete(1), _complete(1), _cut(7)])
        async with running_proxy(up.url) as (proxy, url, recs):
            await _learn(proxy, url, recs, 2)
            assert proxy.token_rates.rate("m1") == 1.0
            await _leave_after(url, 7)
            rec = (await recs.wait(3))[2]
    assert rec.outcome == "cancelled"
    assert rec.token_source == "chunks" and rec.completion_tokens == 7


async def test_non_streamed_answers_are_not_estimated() -> None:
    plain = Script(chunks=[json.dumps({
        "id": "c", "object": "chat.completion", "model": "m1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                     "finish_reason": "stop"}]}).encode()], content_length=True)
    async with scripted_upstream() as up:
        up.responder = _responder([_complete(3), plain])
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            await _learn(proxy, url, recs, 1)
            body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
            async with s.post(url + CHAT, json=body) as r:
                assert r.status == 200 and b"hello" in await r.read()
            rec = (await recs.wait(2))[1]
            assert proxy.token_rates.rate("m1") == 3.0
    assert not rec.stream and rec.token_source == "chunks" and rec.completion_tokens == 1


async def test_against_the_simulator_the_estimate_meets_the_engines_count() -> None:
    async with running_sim("tiny", seed=7, tokens_per_chunk=3) as sim, \
            running_proxy(sim.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
        for _ in range(2):  # complete streams with usage teach 3 tokens an event
            body = {"model": "m", "stream": True, "max_tokens": 30,
                    "messages": [{"role": "user", "content": "x"}]}
            async with s.post(url + CHAT, json=body) as r:
                await r.read()
        await recs.wait(2)
        rate = proxy.token_rates.rate("m")
        assert rate is not None and 2.5 <= rate <= 3.0, rate  # 30 tokens: 1 + 3 × 9 + 2
        body = {"model": "m", "stream": True, "max_tokens": 600,
                "messages": [{"role": "user", "content": "x"}]}
        r = await s.post(url + CHAT, json=body)
        got = b""
        while got.count(b'"content"') < 6:
            got += await r.content.readany()
        r.close()
        rec = (await recs.wait(3))[2]
        for _ in range(200):
            async with s.get(sim.url + "/sim/requests") as t:
                truth = (await t.json())[2]
            if truth["cancelled_at"] is not None:
                break
            await asyncio.sleep(0.005)
    events = len(rec.chunk_offsets_s)
    print(f"\ncancelled after {events} chunks: estimate {rec.completion_tokens} tokens, "
          f"engine generated {truth['completion_tokens']} (rate {rate:.3f})")
    assert rec.outcome == "cancelled" and rec.token_source == "estimate"
    assert rec.completion_tokens is not None and rec.completion_tokens == sum(rec.chunk_tokens)
    # what was forwarded (1 + 3 an event after the first, the estimate rounds the rate's
    # shortfall of the short last event): never above what the engine generated; below it
    # by what the engine made after the client left
    assert rec.completion_tokens <= truth["completion_tokens"] + 1
    assert rec.completion_tokens >= 1 + 2.5 * (events - 1)


def test_learning_follows_the_aggregators_rule() -> None:
    rates = TokenRates()
    rates.learn("m", 25, 7)  # fewer than 8 events: too coarse
    assert rates.rate("m") is None and rates.estimate("m", 7) is None
    rates.learn("m", 28, 10)  # 1 + 9 × 3
    assert rates.rate("m") == 3.0 and rates.estimate("m", 7) == 19
    assert rates.estimate("m", 1) == 1 and rates.estimate("m", 0) is None
    rates.learn("m", 10, 10)
    assert rates.rate("m") == 3.0 + 0.3 * (1.0 - 3.0)  # EWMA 0.3
    assert next_rate(None, 1.01) == 1.0 and next_rate(None, 1000.0) == 64.0
    assert next_rate(None, 0.1) == 0.5
    one = TokenRates()
    one.learn(None, 101, 100)  # within 2% of 1: nothing to estimate
    assert one.rate(None) == 1.0 and one.estimate(None, 50) is None
    many = TokenRates()
    for i in range(100):
        many.learn(f"m{i}", 28, 10)
    assert len(many) == 64 and many.rate("m99") is None  # bounded
