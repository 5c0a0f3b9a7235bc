"""An open stream's chunk times were plain lists (an int object and a pointer a chunk,
~48 bytes with the token count): a 16k-token reasoning answer held ~780 KB while open.
Every HOLD_AT chunks the lists move into packed arrays (16 bytes a chunk); the record is
the same."""

from __future__ import annotations

import itertools
import sys

import aiohttp
import pytest
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

from llmtop.events import ActiveRequest
from llmtop.proxy import relay
from llmtop.proxy.relay import HOLD_AT, Exchange

SSE = {"Content-Type": "text/event-stream"}


def _exchange() -> Exchange:
    a = ActiveRequest(id="r", user="u", model="m", dialect="openai", path="/v1/chat/completions",
                      stream=True, t_start=1_796_000_000.0, t0_ns=10**12)
    ex = Exchange(a)
    ex.stream = True
    ex.status = 200
    ex.end_ns = 10**12 + 10**10
    return ex


def test_held_chunks_give_the_record_the_plain_lists_give() -> None:
    n = 3 * HOLD_AT + 17
    times = [10**12 + 200_000_000 + 7_000_003 * i for i in range(n)]
    toks = [1] + [1 + i % 4 for i in range(1, n)]
    plain, held = _exchange(), _exchange()
    for t, k in zip(times, toks, strict=True):
        plain.offsets.append(t)
        plain.tokens.append(k)
        held.offsets.append(t)
        held.tokens.append(k)
        if len(held.tokens) >= HOLD_AT:
            held.hold()
    assert held.held_offsets is not None and len(held.held_offsets) == 3 * HOLD_AT
    assert len(held.offsets) == 17
    assert held.to_record() == plain.to_record()
    # what is held packed costs 16 bytes a chunk (+ the arrays' spare room; lists: ~48)
    assert held.held_tokens is not None
    packed = sys.getsizeof(held.held_offsets) + sys.getsizeof(held.held_tokens)
    assert packed / (3 * HOLD_AT) < 20
    listed = sys.getsizeof(plain.offsets) + sys.getsizeof(plain.tokens) + 32 * n
    assert listed / n > 40


@pytest.mark.parametrize("hold_at", [5, HOLD_AT])
async def test_a_long_stream_is_recorded_whole_when_its_chunks_are_held(
        monkeypatch: pytest.MonkeyPatch, hold_at: int) -> None:
    """Through the real relay, with the lists moved into arrays every 5 chunks: every
    content chunk the client read is in the record, in order, tokens as the usage says."""
    monkeypatch.setattr(relay, "HOLD_AT", hold_at)
    texts = [f"t{i} " for i in range(40)]
    async with scripted_upstream() as up, running_proxy(up.url) as (_, url, records):
        up.script = Script(chunks=openai_chunks(texts, usage={"prompt_tokens": 3,
                                                                 "completion_tokens": 79}),
                           headers=SSE, gap_s=0.003)
        async with aiohttp.ClientSession() as s, s.post(
                url + "/v1/chat/completions",
                json={"model": "m1", "stream": True, "messages": []}) as resp:
            body = await resp.read()
        rec = (await records.wait(1))[0]
    assert body.count(b'"content":"t') == 40 and b'"usage"' not in body
    offs = rec.chunk_offsets_s
    assert rec.outcome == "ok" and rec.token_source == "usage"
    assert sum(rec.chunk_tokens) == 79 and rec.chunk_tokens[0] == 1
    assert len(offs) == len(rec.chunk_tokens) and 30 <= len(offs) <= 40  # reads may merge
    assert all(b > a for a, b in itertools.pairwise(offs))
    assert rec.ttft_s == offs[0] and offs[-1] <= rec.e2e_s
