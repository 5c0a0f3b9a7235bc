"""llama.cpp and injected usage: its ``timings`` must reach the client.

QA against the real llama.cpp server: asked for ``include_usage``, llama.cpp moves its
``timings`` from the finish event into the usage-only event, which the proxy removes — so
a client that had not asked for usage lost ~250 bytes it gets directly. Now the first such
stream tells the proxy (the removed event held more than usage) and it stops injecting for
that upstream: later streams are byte-exact, and their tokens still come from the engine's
own count (``timings.predicted_n``, ``prompt_n + cache_n``).
"""

from __future__ import annotations

import json

import aiohttp
from test_proxy_support import Script, Seen, running_proxy, scripted_upstream, sse

SSE = {"Content-Type": "text/event-stream"}
CHAT = "/v1/chat/completions"
BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
        "model": "smollm2", "system_fingerprint": "b1"}
TIMINGS = {"cache_n": 3, "prompt_n": 5, "predicted_n": 3, "predicted_ms": 30.0}


def llamacpp(seen: Seen) -> Script:
    """What llama-server sends, with and without ``stream_options.include_usage``."""
    usage = (json.loads(seen.body).get("stream_options") or {}).get("include_usage") is True
    out = [sse({**BASE, "choices": [{"index": 0, "delta": {"content": t},
                                     "finish_reason": None}]}) for t in ("a", "b", "c")]
    finish = {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if usage:
        out.append(sse(finish))
        out.append(sse({**BASE, "choices": [], "usage": {
            "completion_tokens": 3, "prompt_tokens": 8, "total_tokens": 11},
            "timings": TIMINGS}))
    else:
        out.append(sse({**finish, "timings": TIMINGS}))
    out.append(b"data: [DONE]\n\n")
    return Script(chunks=out, headers=SSE)


async def test_injection_stops_once_the_usage_event_carries_timings() -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with scripted_upstream() as up:
        up.responder = llamacpp
        async with running_proxy(up.url) as (proxy, url, recs), \
                aiohttp.ClientSession() as s:
            got = []
            for _ in range(3):
                async with s.post(url + CHAT, json=body) as r:
                    got.append(await r.read())
            records = await recs.wait(3)
        assert proxy.usage_rejected
    asked = [b"include_usage" in seen.body for seen in up.seen]
    assert asked == [True, False, False]  # the first stream taught the proxy
    assert b"timings" not in got[0]  # (what that first stream cost its client)
    for i in (1, 2):  # byte-exact after it, timings included
        assert got[i] == b"".join(up.sent[i]) and b'"timings"' in got[i]
    for r in records:
        assert r.outcome == "ok" and r.token_source == "usage"
        assert r.completion_tokens == 3 and r.prompt_tokens == 8


async def test_a_plain_usage_event_keeps_injection_on() -> None:
    """vLLM/OpenAI-style usage events (nothing but usage) are removed as before."""
    def vllm(seen: Seen) -> Script:
        out = [sse({**BASE, "choices": [{"index": 0, "delta": {"content": "a"}}]}),
               sse({**BASE, "choices": [], "usage": {"completion_tokens": 1,
                                                      "prompt_tokens": 2,
                                                      "total_tokens": 3}}),
               b"data: [DONE]\n\n"]
        return Script(chunks=out, headers=SSE)

    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with scripted_upstream() as up:
        up.responder = vllm
        async with running_proxy(up.url) as (proxy, url, recs), \
                aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(url + CHAT, json=body) as r:
                    assert b'"usage"' not in await r.read()
            await recs.wait(2)
        assert not proxy.usage_rejected
    assert all(b"include_usage" in seen.body for seen in up.seen)
