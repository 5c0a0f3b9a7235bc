"""What each request becomes: one RequestRecord with the domain's definitions, and an
ActiveRequest while it is open."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_proxy_support import (
    Script,
    openai_chunks,
    read_chunks,
    running_proxy,
    scripted_upstream,
    sse,
)

from llmtop.events import RequestRecord
from llmtop.proxy.relay import scale_tokens

SSE = {"Content-Type": "text/event-stream"}
CHAT = "/v1/chat/completions"
WANTS_USAGE = {"model": "m1", "stream": True, "stream_options": {"include_usage": True}}


def test_scale_tokens_largest_remainder() -> None:
    assert scale_tokens([1, 1, 1], 7) == [1, 3, 3]  # the first event is the first token
    assert scale_tokens([1, 1, 1, 1], 4) == [1, 1, 1, 1]
    assert scale_tokens([2, 1, 1], 8) == [4, 2, 2]  # 1 + the share of its second event (3)
    assert scale_tokens([1, 1, 1], 2) == [1, 1, 0]  # ties go to the earlier chunk
    assert scale_tokens([1, 1, 1, 1], 6) == [1, 2, 2, 1]
    assert scale_tokens([1], 9) == [9]
    assert scale_tokens([3], 9) == [9]
    assert scale_tokens([1, 1], 0) == [0, 0]
    assert scale_tokens([0, 0], 3) == [2, 1]
    assert scale_tokens([], 5) == []


def test_scale_tokens_first_token_rule_makes_mean_itl_equal_tpot() -> None:
    """QA: an engine sending 1, 3, 3, …, 3, 1 tokens a chunk with usage only at the end
    was recorded as [3, 3, 3, 3, 2, 2, 2, 2]: the first chunk took decode tokens that then
    gave no ITL sample, and mean ITL was 12% above TPOT. Kept at one token, the ITL
    samples are N − 1 and their mean is TPOT."""
    offsets = tuple(0.2 + 0.03 * i for i in range(8))
    counts = scale_tokens([1] * 8, 20)
    assert counts[0] == 1 and sum(counts) == 20
    rec = RequestRecord(
        id="r", user="u", model="m", dialect="openai", path=CHAT, stream=True, status=200,
        outcome="ok", t_start=0.0, ttft_s=offsets[0], e2e_s=offsets[-1], prompt_tokens=5,
        completion_tokens=20, token_source="usage", chunk_offsets_s=offsets,
        chunk_tokens=tuple(counts), concurrency_at_start=1, error=None)
    itl = rec.itl_samples_s()
    tpot = rec.tpot_s()
    assert tpot is not None and len(itl) == 19
    assert abs(sum(itl) / len(itl) - tpot) < 1e-9


@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.integers(0, 5000))
def test_scale_tokens_always_sums_to_the_usage(counts: list[int], total: int) -> None:
    out = scale_tokens(counts, total)
    assert sum(out) == total and len(out) == len(counts) and min(out) >= 0
    have = sum(counts)
    if have and total and have != total:
        # one token for the first event; no chunk more than one token from its exact share
        # of the rest
        first = 1 if counts[0] else 0
        weights = [counts[0] - first, *counts[1:]]
        wsum = sum(weights) or len(weights)
        if not sum(weights):
            weights = [1] * len(weights)
        exact = [w * (total - first) / wsum for w in weights]
        exact[0] += first
        for e, o in zip(exact, out, strict=True):
            assert abs(o - e) < 1


async def test_ttft_is_the_first_content_chunk_not_the_role_chunk() -> None:
    role, *rest = openai_chunks(["Hi", " there"], usage={"prompt_tokens": 1,
                                                          "completion_tokens": 2,
                                                          "total_tokens": 3})
    async with scripted_upstream() as up:
        # role-only chunk at once, first content 150 ms later
        up.script = Script(chunks=[role, b": keep-alive\n\n", *rest], headers=SSE, gap_s=0.075)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            t0 = time.perf_counter()
            async with s.post(url + CHAT, json=WANTS_USAGE) as r:
                stamps = []
                async for data in r.content.iter_any():
                    stamps.append((time.perf_counter() - t0, data))
            (rec,) = await recs.wait(1)
    # Bounds that hold however late the loop runs: the upstream wrote "Hi" 150 ms and
    # " there" 225 ms after it got the request (no sooner), and the proxy stamped each
    # before the client, whose clock started first, read it. Unstalled the client reads "Hi"
    # at ~0.15 s, so a TTFT taken at " there" (>= 0.225) or at the role chunk or the
    # keep-alive (~0, 0.075) fails; an abs(TTFT - client) < 50 ms check, and a gap of
    # 60-200 ms, failed whenever the loop stalled 50+ ms between a write and its read.
    first_content = next(t for t, d in stamps if b'"content":"Hi"' in d)
    second = next(t for t, d in stamps if b'"content":" there"' in d)
    assert rec.ttft_s is not None and 0.14 <= rec.ttft_s <= first_content
    assert rec.chunk_offsets_s[0] == rec.ttft_s and len(rec.chunk_offsets_s) == 2
    assert 0.21 <= rec.chunk_offsets_s[1] <= second
    gaps = rec.chunk_gaps_s()
    assert gaps == [rec.chunk_offsets_s[1] - rec.chunk_offsets_s[0]]
    assert rec.e2e_s >= rec.chunk_offsets_s[-1]
    assert rec.tpot_s() is not None


async def test_multi_token_chunks_itl_mean_equals_tpot() -> None:
    """An engine that packs 4 tokens a chunk (continuous usage counts them exactly)."""
    base = {"id": "c", "object": "chat.completion.chunk", "model": "m1"}
    chunks = []
    for i in range(1, 7):
        chunks.append(sse({**base, "choices": [{"index": 0, "delta": {"content": "abcd"}}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 4 * i,
                                     "total_tokens": 5 + 4 * i}}))
    chunks.append(b"data: [DONE]\n\n")
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=SSE, gap_s=0.02)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT, json=WANTS_USAGE) as r:
                await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert rec.chunk_tokens == (4, 4, 4, 4, 4, 4) and rec.completion_tokens == 24
    itl = rec.itl_samples_s()
    assert len(itl) == 20  # 5 gaps after the first chunk, 4 tokens each
    tpot = rec.tpot_s()
    assert tpot is not None
    # TPOT spreads (E2E - TTFT) over n-1 tokens; ITL spreads the same gaps over 4 tokens
    # each: they agree up to the first chunk's extra tokens and the tail after the last,
    # exactly (mean ITL within 25 % of TPOT failed when the machine paused in that tail)
    span = rec.chunk_offsets_s[-1] - rec.chunk_offsets_s[0]
    assert sum(itl) == pytest.approx(span)
    assert tpot * 23 == pytest.approx(sum(itl) + (rec.e2e_s - rec.chunk_offsets_s[-1]))


async def test_active_request_visible_while_streaming() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c", "d"]), headers=SSE,
                           gap_s=0.05)
        async with running_proxy(up.url) as (proxy, url, recs), aiohttp.ClientSession() as s:
            body = {**WANTS_USAGE, "user": "carol", "model": "big-model"}
            async with s.post(url + CHAT, json=body) as r:
                await r.content.readany()  # the role chunk
                (a,) = proxy.active.values()
                assert a.user == "carol" and a.model == "big-model" and a.stream
                assert a.state == "waiting" and a.chunks == 0
                while a.chunks < 2:
                    await r.content.readany()
                assert a.state == "streaming" and a.tokens >= 2
                live = a.to_json_dict(time.perf_counter_ns())
                assert live["state"] == "streaming" and live["ttft_s"] > 0
                await r.read()
            (rec,) = await recs.wait(1)
            assert proxy.active == {}
    assert rec.id == a.id and rec.user == "carol"


def anthropic_event(obj: dict[str, object]) -> bytes:
    return f"event: {obj['type']}\n".encode() + sse(obj)


async def test_active_row_has_the_status_once_the_head_is_out_and_the_prompt_once_told(
) -> None:
    """An open request's row says ``status`` from when its response head went to the
    client (not before: it could still be the proxy's own 502 or 504), and
    ``prompt_tokens`` from when the stream gave the prompt's size (Anthropic's
    ``message_start``), as the record will. Before, both stayed null until the end."""
    start = anthropic_event({"type": "message_start", "message": {
        "id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 21, "output_tokens": 1}}})
    delta = anthropic_event({"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "hi"}})
    body = {"model": "claude-x", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "hello"}]}
    async with scripted_upstream() as up, running_proxy(up.url) as (proxy, url, recs), \
            aiohttp.ClientSession() as s:

        async def post() -> None:
            """Until the proxy has counted a content chunk (then the client leaves)."""
            async with s.post(url + "/v1/messages", json=body) as r:
                async for _ in r.content.iter_any():
                    if any(x.chunks for x in proxy.active.values()):
                        return

        up.script = Script(chunks=[start], headers=SSE, first_delay_s=60)
        waiting = asyncio.create_task(post())
        await up.received.wait()
        (a,) = proxy.active.values()
        row = a.to_json_dict(time.perf_counter_ns())
        assert (row["state"], row["status"], row["prompt_tokens"]) == ("waiting", None, None)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        (gone,) = await recs.wait(1)

        up.script = Script(chunks=[start, delta], headers=SSE, hang_after=2)
        up.received.clear()
        streaming = asyncio.create_task(post())
        await up.received.wait()
        (a,) = proxy.active.values()
        await streaming  # returns once the proxy counted the content chunk
        row = a.to_json_dict(time.perf_counter_ns())
        assert (row["state"], row["status"], row["prompt_tokens"]) == ("streaming", 200, 21)
        rec = (await recs.wait(2))[-1]
    assert gone.outcome == "cancelled" and rec.id == a.id
    assert (rec.status, rec.prompt_tokens) == (200, 21)


async def test_concurrency_at_start_counts_requests_open_including_itself() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b"]), headers=SSE, gap_s=0.1)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async def one(delay: float) -> None:
                await asyncio.sleep(delay)
                async with s.post(url + CHAT, json=WANTS_USAGE) as r:
                    await r.read()

            await asyncio.gather(one(0), one(0.05), one(0.1))
            recs_ = await recs.wait(3)
    by_start = sorted(recs_, key=lambda r: r.t_start)
    assert [r.concurrency_at_start for r in by_start] == [1, 2, 3]
    assert len({r.id for r in recs_}) == 3


async def test_record_is_json_ready_and_private() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["x"]), headers=SSE)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + CHAT + "?api_key=sk-in-query", json=WANTS_USAGE,
                              headers={"Authorization": "Bearer sk-very-secret"}) as r:
                await r.read()
            (rec,) = await recs.wait(1)
    line = json.dumps(rec.to_json_dict())
    assert "sk-very-secret" not in line and "sk-in-query" not in line
    assert rec.path == CHAT
    assert abs(rec.t_start - time.time()) < 60
