"""OpenAI-style streams with ``n > 1``: every usage-only event the proxy caused is removed,
and the recorded usage covers every choice.

QA against the real llama.cpp server: asked for ``include_usage`` with ``n: 2``, it sends
one usage-only event per choice — each as its choice ends, so the first comes while the
other choice is still streaming — each with that choice's ``completion_tokens`` and the
whole prompt's ``prompt_tokens``. Only the first was removed (the client, which had not
asked for usage, got the second) and the record counted one choice. Without usage, each
choice's finish event carries its own ``timings``: only the first was counted. vLLM sends
one usage event for all choices; continuous usage stats (usage on every chunk, cumulative)
keep the last value. The streams below follow the bytes llama.cpp sent for such a request
(captured from ``llama-server`` built by tools/real_engine.py: key order, interleaving,
``timings``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from test_proxy_support import Script, Seen, read_chunks, running_proxy, scripted_upstream

from llmtop.proxy.dialects import UsageChunkStripper
from llmtop.proxy.dialects.openai import OpenAIStreamParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
CHAT = "/v1/chat/completions"
SSE = {"Content-Type": "text/event-stream"}
HEAD = {"created": 1796103179, "id": "chatcmpl-p3M3Is2uPoNfoiRUrAJA9hiylkAxSl4H",
        "model": "smollm2-135m-instruct", "system_fingerprint": "b0-unknown",
        "object": "chat.completion.chunk"}
PROMPT = 33
TEXTS = {1: ["Hello", ",", " how", " can", " I", " assist"], 0: ["Say", " hello", ".", " 🌟"]}
PREDICTED = {1: 6, 0: 5}  # choice 0 stopped on end-of-sequence: a token in no content event
TOTAL = sum(PREDICTED.values())  # 11: not the first (6), the last (5) nor the largest


def _event(obj: dict[str, Any], eol: bytes = b"\n") -> bytes:
    return (b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
            + eol + eol)


def _choice(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish, "index": i, "delta": delta}], **HEAD}


def _timings(i: int) -> dict[str, Any]:
    return {"cache_n": 0, "prompt_n": PROMPT, "prompt_ms": 248.667, "predicted_n": PREDICTED[i],
            "predicted_ms": 198.7}


def _usage(i: int) -> dict[str, Any]:
    """llama.cpp's usage-only event for choice ``i`` (its ``timings`` moved into it)."""
    return {"choices": [], **HEAD, "usage": {
        "completion_tokens": PREDICTED[i], "prompt_tokens": PROMPT,
        "total_tokens": PROMPT + PREDICTED[i], "prompt_tokens_details": {"cached_tokens": 0}},
        "timings": _timings(i)}


def llamacpp_n2(usage: bool, *, adjacent: bool = False, timings: bool = True,
                eol: bytes = b"\n") -> list[tuple[bool, bytes]]:
    """The events of llama.cpp's answer to an ``n: 2`` chat stream, in its order, each with
    whether it is a usage-only event. ``usage``: as asked with ``include_usage`` (one
    usage-only event per choice, as its choice ends), else ``timings`` on each finish
    event. ``adjacent``: both usage events together at the end instead. ``timings=False``:
    usage events that hold nothing but usage."""
    t1, t0 = iter(TEXTS[1]), iter(TEXTS[0])
    ev: list[tuple[bool, dict[str, Any]]] = [
        (False, _choice(1, {"role": "assistant", "content": None})),
        (False, _choice(1, {"content": next(t1)})),
        (False, _choice(0, {"role": "assistant", "content": None})),
        (False, _choice(0, {"content": next(t0)})),
        (False, _choice(1, {"content": next(t1)})),
        (False, _choice(0, {"content": next(t0)})),
        (False, _choice(1, {"content": next(t1)})),
        (False, _choice(0, {"content": next(t0)})),
        *[(False, _choice(1, {"content": t})) for t in t1],
    ]
    finish1 = _choice(1, {}, "length")
    finish0 = _choice(0, {}, "stop")
    if not usage:
        finish1["timings"], finish0["timings"] = _timings(1), _timings(0)
    usage1, usage0 = _usage(1), _usage(0)
    if not timings:
        del usage1["timings"], usage0["timings"]
    ev.append((False, finish1))
    if usage and not adjacent:
        ev.append((True, usage1))
    ev += [(False, _choice(0, {"content": t})) for t in t0]
    ev.append((False, finish0))
    if usage:
        if adjacent:
            ev.append((True, usage1))
        ev.append((True, usage0))
    out = [(u, _event(obj, eol)) for u, obj in ev]
    return [*out, (False, b"data: [DONE]" + eol + eol)]


def all_splits(raw: bytes, seed: int = 0, near: list[int] | None = None) -> list[list[bytes]]:
    """Every two-read split (only those cutting within 24 bytes of an offset in ``near``,
    if given), one read per byte, and 100 random many-read splits."""
    cuts_at = range(len(raw) + 1) if near is None else sorted(
        {i for at in near for i in range(max(0, at - 24), min(len(raw), at + 24) + 1)})
    splits = [[raw[:i], raw[i:]] for i in cuts_at]
    splits.append([raw[i : i + 1] for i in range(len(raw))])
    rng = random.Random(seed)
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(raw)), k=rng.randint(2, 40)))
        splits.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)])
    return splits


def strip(pieces: list[bytes]) -> tuple[bytes, UsageChunkStripper]:
    s = UsageChunkStripper()
    out = b"".join(s.filter(p) for p in pieces) + s.flush()
    return out, s


def parse(pieces: list[bytes]) -> OpenAIStreamParser:
    p = OpenAIStreamParser()
    for piece in pieces:
        p.feed(piece)
    p.finish()
    return p


@pytest.mark.parametrize("adjacent", [False, True], ids=["interleaved", "adjacent"])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_usage_event_is_removed_at_every_split(eol: bytes, adjacent: bool) -> None:
    events = llamacpp_n2(True, adjacent=adjacent, eol=eol)
    raw = b"".join(e for _, e in events)
    want = b"".join(e for usage, e in events if not usage)
    assert sum(usage for usage, _ in events) == 2 and raw.count(b'"choices":[]') == 2
    # "\n": a cut at every byte; "\r\n", "\r": every cut near the ends of the usage events
    # (where a "\r" that ends a removed event is told from the next event's bytes)
    near: list[int] | None = None
    if eol != b"\n":
        near, at = [], 0
        for usage, e in events:
            if usage:
                near += [at, at + len(e)]
            at += len(e)
    for pieces in all_splits(raw, len(raw), near):
        got, s = strip(pieces)
        assert got == want, [len(p) for p in pieces]
        assert s.removed == 2 and s.stripped and s.extra_fields


@pytest.mark.parametrize("adjacent", [False, True], ids=["interleaved", "adjacent"])
def test_usage_is_summed_over_the_usage_events_at_every_split(adjacent: bool) -> None:
    raw = b"".join(e for _, e in llamacpp_n2(True, adjacent=adjacent))
    for pieces in all_splits(raw, 7):
        p = parse(pieces)
        assert p.usage_completion_tokens == TOTAL, [len(x) for x in pieces]
        assert p.usage_prompt_tokens == PROMPT  # the same prompt in each: not summed
        assert p.done and p.error is None


def test_what_the_client_gets_has_no_usage_and_both_answers() -> None:
    events = llamacpp_n2(True)
    out, _ = strip([e for _, e in events])  # one read per event, as the relay mostly sees
    p = parse([out])
    assert not p.usage_seen and p.usage_completion_tokens is None
    texts: dict[int, str] = {0: "", 1: ""}
    for block in out.split(b"\n\n"):
        if block.startswith(b"data: {"):
            obj = json.loads(block[6:])
            assert obj["choices"] and "usage" not in obj
            ch = obj["choices"][0]
            texts[ch["index"]] += ch["delta"].get("content") or ""
    assert texts == {i: "".join(t) for i, t in TEXTS.items()}


def test_timings_of_every_choice_are_summed_without_usage() -> None:
    """What the proxy reads once injection is off for llama.cpp: a ``timings`` on each
    choice's finish event."""
    raw = b"".join(e for _, e in llamacpp_n2(False))
    assert raw.count(b'"timings"') == 2
    for pieces in all_splits(raw, 3)[::7]:
        p = parse(pieces)
        assert p.usage_completion_tokens == TOTAL and p.usage_prompt_tokens == PROMPT


def test_a_single_usage_event_is_counted_as_before() -> None:
    """vLLM/OpenAI: one usage event for all choices (n=2 here), content events without
    usage: its figures, as they are, and that one event removed."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    content = [_event({**base, "choices": [{"index": i, "delta": {"content": t}}]})
               for i, t in [(0, "a"), (1, "b"), (0, "c"), (1, "d")]]
    usage = _event({**base, "choices": [], "usage": {"prompt_tokens": 4,
                                                     "completion_tokens": 7,
                                                     "total_tokens": 11}})
    done = b"data: [DONE]\n\n"
    raw = b"".join([*content, usage, done])
    for pieces in all_splits(raw, 11)[::5]:
        p = parse(pieces)
        assert p.usage_completion_tokens == 7 and p.usage_prompt_tokens == 4
        out, s = strip(pieces)
        assert out == b"".join([*content, done])
        assert s.stripped and not s.extra_fields


def test_continuous_usage_keeps_the_last_cumulative_value() -> None:
    """vLLM's ``continuous_usage_stats``: usage on every chunk, cumulative — the last value
    counts, not a sum (with and without the final usage-only event)."""
    raw = (FIXTURES / "openai_continuous_usage_reasoning.sse").read_bytes()
    final = [json.loads(b[6:]) for b in raw.split(b"\n\n") if b'"choices":[]' in b]
    assert len(final) == 1 and raw.count(b'"usage"') > 3
    for pieces in all_splits(raw, 5)[::11]:
        p = parse(pieces)
        assert p.usage_completion_tokens == final[0]["usage"]["completion_tokens"] == 8
        assert p.usage_prompt_tokens == 20
    without_final = b"".join(b + b"\n\n" for b in raw.split(b"\n\n")
                             if b and b'"choices":[]' not in b)
    p = parse([without_final])
    assert p.usage_completion_tokens == 8 and p.usage_prompt_tokens == 20


# --- over real sockets: a llama.cpp-like upstream, the proxy, the openai SDK ---------------


def llamacpp_upstream(timings: bool = True) -> Any:
    def answer(seen: Seen) -> Script:
        body = json.loads(seen.body)
        assert body.get("n") == 2
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        return Script(chunks=[e for _, e in llamacpp_n2(usage, timings=timings)], headers=SSE)
    return answer


async def _sdk_stream(url: str, **extra: Any) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Say hello."}],
            stream=True, n=2, max_tokens=6, **extra)
        return [c async for c in stream]
    finally:
        await client.close()


def _texts(chunks: list[Any]) -> dict[int, str]:
    texts: dict[int, str] = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    return texts


async def test_openai_sdk_n2_through_the_proxy_sees_no_usage_and_the_record_sums() -> None:
    want_texts = {i: "".join(t) for i, t in TEXTS.items()}
    async with scripted_upstream() as up:
        up.responder = llamacpp_upstream()
        async with running_proxy(up.url) as (proxy, url, recs):
            injected = await _sdk_stream(url)  # usage injected, both events removed
            plain = await _sdk_stream(url)  # injection off now (the events held timings)
            asked = await _sdk_stream(url, stream_options={"include_usage": True})
            records = await recs.wait(3)
        assert proxy.usage_rejected
    assert [b"include_usage" in seen.body for seen in up.seen] == [True, False, True]
    for chunks in (injected, plain):
        assert all(c.usage is None for c in chunks)
        assert all(c.choices for c in chunks)  # no choices=[] chunk reached the SDK
        assert _texts(chunks) == want_texts
    # the client that asked for usage gets both events, untouched
    assert [c.usage.completion_tokens for c in asked if c.usage is not None] == [6, 5]
    assert _texts(asked) == want_texts
    for r in records:
        assert r.outcome == "ok" and r.token_source == "usage"
        assert r.completion_tokens == TOTAL and r.prompt_tokens == PROMPT


async def test_usage_only_events_without_extras_stay_injected_and_are_all_removed() -> None:
    """Any upstream sending several usage-only events holding only usage: every stream has
    usage injected, and every client gets the upstream's bytes minus exactly those events."""
    body = {"model": "m", "stream": True, "n": 2,
            "messages": [{"role": "user", "content": "hi"}]}
    async with scripted_upstream() as up:
        up.responder = llamacpp_upstream(timings=False)
        async with running_proxy(up.url) as (proxy, url, recs), \
                aiohttp.ClientSession() as s:
            got = []
            for _ in range(2):
                async with s.post(url + CHAT, json=body) as r:
                    got.append(b"".join(await read_chunks(r)))
            records = await recs.wait(2)
        assert not proxy.usage_rejected
    assert all(b"include_usage" in seen.body for seen in up.seen)
    want = b"".join(e for usage, e in llamacpp_n2(True, timings=False) if not usage)
    for i in range(2):
        assert b"".join(up.sent[i]).count(b'"choices":[]') == 2
        assert got[i] == want
    for r in records:
        assert r.token_source == "usage" and r.completion_tokens == TOTAL
        assert r.prompt_tokens == PROMPT
