"""llama.cpp is the truth: what the openai SDK (sync and async) gets through ``llmtop run
--headless`` is what it gets straight from the engine, and what llmtop records is what the
engine says it did (its ``usage`` and its own ``timings``), for the cases the other e2e
files do not cover: answers that are not streamed, ``finish_reason`` (length, a natural
end, a stop sequence), ``n = 2`` chat streams, a request the engine refuses (the prompt
does not fit the context) and the engine's ``prompt_ms``/``predicted_ms`` against the
recorded TTFT and decode time.

Each test has its own llmtop behind a byte-recording tee (engine ← tee ← llmtop ← client),
so the bytes llmtop read from the engine for the very same request are at hand.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from e2e_support import (
    CHAT,
    MODEL,
    PROMPT,
    USER_HEADER,
    LlmtopProcess,
    Tee,
    TeeExchange,
    has_usage_only_event,
    new_user,
    sse_events,
    teed_llmtop,
    timings_of,
    usage_of,
    wait_engine_idle,
)


@pytest.fixture
async def teed(engine: Any, tmp_path: Path) -> AsyncIterator[tuple[Tee, LlmtopProcess]]:
    """engine ← Tee ← llmtop ← client (a fresh llmtop: nothing learnt from other tests)."""
    async with teed_llmtop(engine.url, tmp_path / "qa.jsonl") as pair:
        yield pair


def sync_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="e2e-not-a-secret", max_retries=0)


def async_client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="e2e-not-a-secret", max_retries=0)


def exchange(tee: Tee, before: int, path: str) -> TeeExchange:
    (ex,) = [e for e in tee.exchanges[before:] if e.path == path]
    return ex


def _common(user: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "extra_headers": {USER_HEADER: user},
        **extra,
    }


# -- not streamed: the body is the engine's, byte for byte; TTFT ≈ E2E --------------------


@pytest.mark.parametrize("kind", ["chat", "completions"])
async def test_non_streamed_answer_is_the_engines_and_the_record_its_usage(
    engine: Any, teed: tuple[Tee, LlmtopProcess], kind: str
) -> None:
    """Sync SDK, ``stream`` not set: the client's body is byte for byte the body llmtop read
    from llama.cpp, its choices equal a direct request's (temperature 0, same seed), and the
    record has the engine's usage (= ``timings.predicted_n``), TTFT at the last body bytes
    (E2E a read later at most), one chunk."""
    tee, proc = teed
    user = new_user(f"whole-{kind}")
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"

    def call(client: openai.OpenAI, who: str) -> Any:
        if kind == "chat":
            return client.chat.completions.with_raw_response.create(
                messages=CHAT,
                **_common(who, 16),  # type: ignore[arg-type]
            )
        return client.completions.with_raw_response.create(prompt=PROMPT, **_common(who, 16))

    def both() -> tuple[Any, Any, Any, int]:
        with sync_client(engine.url) as direct, sync_client(proc.proxy_url) as proxied:
            want = call(direct, new_user("direct")).parse()
            before = len(tee.exchanges)
            raw = call(proxied, user)
            return want, raw, raw.parse(), before

    want, raw, got, before = await asyncio.to_thread(both)
    upstream = exchange(tee, before, path)
    assert raw.http_response.status_code == 200
    assert raw.http_response.content == bytes(upstream.response_body)
    assert "stream_options" not in json.loads(upstream.request_body)
    engine_answer = json.loads(upstream.response_body)
    if kind == "chat":
        assert [(c.message.content, c.finish_reason) for c in got.choices] == [
            (c.message.content, c.finish_reason) for c in want.choices
        ]
    else:
        assert [(c.text, c.finish_reason) for c in got.choices] == [
            (c.text, c.finish_reason) for c in want.choices
        ]
    assert got.choices[0].finish_reason == "length"
    usage, timings = engine_answer["usage"], engine_answer["timings"]
    assert usage["completion_tokens"] == timings["predicted_n"] == 16
    (rec,) = await proc.records_for([user])
    assert rec["stream"] is False and rec["status"] == 200 and rec["outcome"] == "ok"
    assert rec["token_source"] == "usage"
    assert rec["completion_tokens"] == usage["completion_tokens"]
    assert rec["prompt_tokens"] == usage["prompt_tokens"]
    assert rec["chunk_tokens"] == [usage["completion_tokens"]]
    # the whole answer is counted when its last body bytes were written; the end of the
    # response (the chunked terminator) may come in a later read (CI: 71 µs after)
    assert 0 < rec["ttft_s"] <= rec["e2e_s"] < rec["ttft_s"] + 0.005, rec
    # the whole answer cannot arrive before llama.cpp finished prefill and decode
    assert rec["e2e_s"] * 1e3 >= timings["prompt_ms"] + timings["predicted_ms"] - 1.0


# -- finish reasons and stop sequences, streamed, client asking for usage or not ------------

FINISH_CASES = [
    # (id, path, request fields, finish reason the engine gives)
    ("length", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 12}, "length"),
    ("natural", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 200}, "stop"),
    ("stop-seq", "/v1/chat/completions",
     {"messages": CHAT, "max_tokens": 40, "stop": [","]}, "stop"),
    ("cmpl-stop-seq", "/v1/completions",
     {"prompt": PROMPT, "max_tokens": 40, "stop": [","]}, "stop"),
    ("cmpl-length", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12}, "length"),
]  # fmt: skip


def _choices_seq(body: bytes) -> list[Any]:
    """Per event: its choices as sent (ids, timestamps, usage and timings left out)."""
    out: list[Any] = []
    for payload in sse_events(body):
        if payload == b"[DONE]":
            out.append("[DONE]")
            continue
        obj = json.loads(payload)
        if obj.get("choices") == [] and obj.get("usage"):
            out.append("usage-only")
            continue
        out.append((obj.get("object"), obj.get("model"), obj.get("choices")))
    return out


async def _stream_raw(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], user: str
) -> bytes:
    got = bytearray()
    async with session.post(url, json=body, headers={USER_HEADER: user}) as resp:
        assert resp.status == 200, await resp.text()
        async for data in resp.content.iter_any():
            got += data
    return bytes(got)


@pytest.mark.parametrize("client_usage", [False, True], ids=["no-usage", "usage"])
async def test_finish_reasons_and_stop_sequences_pass_through_and_counts_are_the_engines(
    engine: Any, teed: tuple[Tee, LlmtopProcess], client_usage: bool
) -> None:
    """max_tokens reached, a natural end (EOS) and a stop sequence: the events' choices
    (text and ``finish_reason``) through llmtop equal a direct request's; the client gets a
    usage-only event exactly when it asked for one; the record's count is the engine's
    ``timings.predicted_n`` for that very request (the EOS and the stop token included,
    as llama.cpp counts them)."""
    tee, proc = teed
    async with aiohttp.ClientSession() as session:
        for name, path, fields, reason in FINISH_CASES:
            body: dict[str, Any] = {
                "model": MODEL, "stream": True, "temperature": 0, "seed": 1, **fields,
            }  # fmt: skip
            if client_usage:
                body["stream_options"] = {"include_usage": True}
            await wait_engine_idle(session, engine.url)
            direct = await _stream_raw(session, engine.url + path, body, new_user("direct"))
            await wait_engine_idle(session, engine.url)
            user = new_user(f"fin-{name}")
            before = len(tee.exchanges)
            got = await _stream_raw(session, proc.proxy_url + path, body, user)
            upstream = bytes(exchange(tee, before, path).response_body)
            want_seq, got_seq = _choices_seq(direct), _choices_seq(got)
            if not client_usage:  # llama.cpp's usage-only event comes only when asked
                assert "usage-only" not in want_seq
            assert got_seq == want_seq, name
            assert has_usage_only_event(got) == (client_usage and path.endswith("chat/completions"))
            finishes = [c["finish_reason"] for e in got_seq if isinstance(e, tuple)
                        for c in e[2] if c.get("finish_reason")]  # fmt: skip
            assert finishes == [reason], (name, finishes)
            timings = timings_of(upstream)
            assert timings is not None, name
            (rec,) = await proc.records_for([user])
            assert rec["outcome"] == "ok" and rec["status"] == 200, (name, rec)
            assert rec["token_source"] == "usage", name
            assert rec["completion_tokens"] == timings["predicted_n"], (name, rec, timings)
            usage = usage_of(upstream)
            if usage is not None:
                assert rec["completion_tokens"] == usage["completion_tokens"], name
                assert rec["prompt_tokens"] == usage["prompt_tokens"], name
            assert sum(rec["chunk_tokens"]) == rec["completion_tokens"], name
            assert rec["ttft_s"] is not None and 0 < rec["ttft_s"] <= rec["e2e_s"], name


# -- n = 2 chat streams: both choices counted ----------------------------------------------


@pytest.mark.parametrize("client_usage", [False, True], ids=["no-usage", "usage"])
async def test_chat_n2_stream_counts_both_choices(
    engine: Any, teed: tuple[Tee, LlmtopProcess], client_usage: bool
) -> None:
    """Chat with ``n: 2``: llama.cpp interleaves both choices, puts ``timings`` on each
    finish event (or, when usage is asked, one usage-only event per choice). The record's
    count is both choices' ``predicted_n`` together, and the client sees no usage-only
    event unless it asked (then both, as sent)."""
    tee, proc = teed
    user = new_user("chat-n2")
    body: dict[str, Any] = {
        "model": MODEL, "messages": CHAT, "n": 2, "max_tokens": 6, "temperature": 1.0,
        "seed": 3, "stream": True, "ignore_eos": True,
    }  # fmt: skip
    if client_usage:
        body["stream_options"] = {"include_usage": True}
    async with aiohttp.ClientSession() as session:
        await wait_engine_idle(session, engine.url)
        before = len(tee.exchanges)
        got = await _stream_raw(session, proc.proxy_url + "/v1/chat/completions", body, user)
    upstream = bytes(exchange(tee, before, "/v1/chat/completions").response_body)
    predicted: dict[int, int] = {}
    usage_only: list[bytes] = []
    for payload in sse_events(upstream):
        if payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        if obj.get("choices") == [] and obj.get("usage"):
            usage_only.append(payload)
        t = obj.get("timings")
        if isinstance(t, dict) and obj.get("choices"):
            predicted[obj["choices"][0]["index"]] = t["predicted_n"]
    client_usage_only = [p for p in sse_events(got) if p.startswith(b"{")
                         and json.loads(p).get("choices") == []]  # fmt: skip
    if client_usage:
        assert got == upstream
        assert len(usage_only) == 2
    else:
        assert client_usage_only == []
    (rec,) = await proc.records_for([user])
    assert rec["outcome"] == "ok" and rec["token_source"] == "usage"
    if usage_only:
        total = sum(json.loads(p)["usage"]["completion_tokens"] for p in usage_only)
    else:
        assert sorted(predicted) == [0, 1]
        total = sum(predicted.values())
    assert total == 12
    assert rec["completion_tokens"] == total
    assert sum(rec["chunk_tokens"]) == total


# -- the engine refuses: its 400 passes through unchanged, the record says why -------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_context_too_long_400_passes_through_and_is_recorded_as_an_error(
    engine: Any, teed: tuple[Tee, LlmtopProcess], stream: bool
) -> None:
    """A prompt longer than a slot's context: llama.cpp answers 400
    ``exceed_context_size_error``. Through llmtop the sync and the async SDK raise the same
    ``BadRequestError`` with the same body as straight from the engine, the bytes are the
    engine's, and the record says error, status 400 and the kind, with no TTFT or tokens."""
    tee, proc = teed
    long_chat = [{"role": "user", "content": "hello world " * 3000}]
    users = [new_user("toolong-sync"), new_user("toolong-async")]
    extra: dict[str, Any] = {"stream": True} if stream else {}

    def sync_call(base: str, who: str) -> openai.BadRequestError:
        with sync_client(base) as client, pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(messages=long_chat, **_common(who, 5, **extra))  # type: ignore[call-overload]
        return err.value

    async def async_call(base: str, who: str) -> openai.BadRequestError:
        async with async_client(base) as client:
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(  # type: ignore[call-overload]
                    messages=long_chat, **_common(who, 5, **extra)
                )
        return err.value

    want = await asyncio.to_thread(sync_call, engine.url, new_user("direct"))
    before = len(tee.exchanges)
    got_sync = await asyncio.to_thread(sync_call, proc.proxy_url, users[0])
    got_async = await async_call(proc.proxy_url, users[1])
    upstreams = [e for e in tee.exchanges[before:] if e.path == "/v1/chat/completions"]
    assert len(upstreams) == 2
    assert want.response.content.startswith(b'{"error"')
    for got, up in zip((got_sync, got_async), upstreams, strict=True):
        assert got.status_code == want.status_code == up.status == 400
        assert got.response.content == want.response.content == bytes(up.response_body)
        assert got.body == want.body
        assert got.response.headers["content-type"] == want.response.headers["content-type"]
    for rec in await proc.records_for(users):
        assert rec["outcome"] == "error" and rec["status"] == 400, rec
        assert "exceed_context_size_error" in (rec["error"] or ""), rec
        assert rec["ttft_s"] is None and rec["completion_tokens"] is None, rec
        assert rec["chunk_tokens"] == [] and rec["e2e_s"] > 0, rec


# -- llama.cpp's own timings vs the record ------------------------------------------------

TIMING_RUNS = 8
TTFT_OVER_PROMPT_MS = (0.0, 15.0)
"""Recorded TTFT minus llama.cpp's ``prompt_ms``: never negative (llama.cpp's clock starts
later — after the request is parsed, tokenised and given a slot — and stops when prefill
ends, before the first token is even sampled and written), and at the median at most 15 ms
(HTTP parsing, tokenisation, chat template and two loopback hops: measured 2-5 ms on a
2-core machine). Each run may exceed it (a busy machine), not the median."""
DECODE_MS = 5.0
"""|(E2E − TTFT) − predicted_ms| at the median. llama.cpp's ``predicted_ms`` runs from the
end of prefill (just before the first token is sent) to the last token; the proxy's
E2E − TTFT runs from writing the first token to the end of the body, which follows the
last token at once. Measured within 1 ms; 5 ms leaves room for a loaded machine, and any
misplaced timestamp (a chunk held back, t0 taken late) costs tens of ms."""


@pytest.mark.parametrize("kind", ["chat", "completions"])
async def test_ttft_and_decode_time_agree_with_llamacpps_timings(
    engine: Any, teed: tuple[Tee, LlmtopProcess], kind: str
) -> None:
    """Streamed through the async SDK one at a time (the engine idle): per request the
    record's ``completion_tokens`` equals ``timings.predicted_n`` exactly, TTFT is
    ``prompt_ms`` plus a few ms, and E2E − TTFT is ``predicted_ms`` (see the bounds above)."""
    tee, proc = teed
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    ttft_over: list[float] = []
    decode_off: list[float] = []
    async with aiohttp.ClientSession() as session, async_client(proc.proxy_url) as client:
        for i in range(TIMING_RUNS):
            await wait_engine_idle(session, engine.url)
            user = new_user(f"tim-{kind}")
            prompt = f"Tell me fact number {i + 1} about the moon."
            common = _common(user, 24, stream=True, extra_body={"ignore_eos": True})
            before = len(tee.exchanges)
            if kind == "chat":
                chat = await client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt}], **common
                )
                async for _ in chat:
                    pass
            else:
                cmpl = await client.completions.create(prompt=prompt, **common)
                async for _ in cmpl:
                    pass
            timings = timings_of(bytes(exchange(tee, before, path).response_body))
            assert timings is not None
            (rec,) = await proc.records_for([user])
            assert rec["completion_tokens"] == timings["predicted_n"] == 24, (rec, timings)
            ttft_over.append(rec["ttft_s"] * 1e3 - timings["prompt_ms"])
            decode_off.append((rec["e2e_s"] - rec["ttft_s"]) * 1e3 - timings["predicted_ms"])
    print(
        f"\n{kind}: TTFT - prompt_ms {[round(x, 1) for x in ttft_over]} ms; "
        f"(E2E - TTFT) - predicted_ms {[round(x, 1) for x in decode_off]} ms"
    )
    assert min(ttft_over) >= TTFT_OVER_PROMPT_MS[0] - 0.5, ttft_over
    assert statistics.median(ttft_over) <= TTFT_OVER_PROMPT_MS[1], ttft_over
    assert statistics.median(abs(d) for d in decode_off) <= DECODE_MS, decode_off
