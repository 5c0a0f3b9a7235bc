"""Streams from a real llama.cpp server through ``llmtop run --headless``: text, bytes,
token counts and timings, as a client that none of us wrote (the openai SDK) sees them."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from e2e_support import (
    CHAT,
    MODEL,
    PROMPT,
    USER_HEADER,
    ClientRun,
    LlmtopProcess,
    Tee,
    has_usage_only_event,
    llamacpp_without_usage,
    new_user,
    openai_client,
    percentile,
    sdk_stream,
    teed_llmtop,
    timings_of,
    usage_of,
    wait_engine_idle,
)

AGREE_S = 0.005
"""The proxy's timings agree with the client's within 5 ms: always at the median of the
differences (a systematic error — a timestamp taken at the wrong place, a chunk held back —
shows there whatever the machine's load)."""
P99_S = float(os.environ.get("LLMTOP_E2E_P99_MS", "20")) / 1000
"""Bound on the 99th percentile of the differences. The target is 5 ms
(``LLMTOP_E2E_P99_MS=5``, as ``benchmarks/real_engine.sh timing`` runs it). Measured
2026-11-30 on a 2-core machine (100 requests x 8 tokens): it held in 5 runs of 5 with
other processes' background load 1.3-2.2 (p99 TTFT/E2E/chunk at most 4.99/4.3/2.6 ms;
1.7/1.7/0.65 ms in the quietest), not with two CPU hogs besides (5.2-7.4 ms, 3 of 3) —
with the hogs the proxy reads the request late when it gets the CPU late (``t0-send``).
Since the relay reads a chunk's time just before its write (not after it: a client woken
by the write could read the chunk first), no difference is negative. The default bound,
20 ms, holds with margin on a loaded CI machine and still fails any real mismatch (a
timestamp taken at the wrong place costs tens of ms); the median, at 5 ms, catches any
systematic error; the figures are printed every run."""
TIMING_REQUESTS = int(os.environ.get("LLMTOP_E2E_TIMING_REQUESTS", "100"))
"""Short requests, one after another: 100 makes the p99 of TTFT/E2E the second largest
difference (not the largest), and ×``TIMING_TOKENS`` chunks the per-chunk p99."""
TIMING_TOKENS = 8


@pytest.mark.parametrize("kind", ["chat", "completions"])
async def test_text_through_the_proxy_equals_a_direct_request(
    engine: Any, llmtop: LlmtopProcess, kind: str
) -> None:
    """Same seed, temperature 0: the text through llmtop is the text straight from llama.cpp,
    and the usage the client asked for arrives and matches what llmtop recorded."""
    async with openai_client(engine.url) as direct, openai_client(llmtop.proxy_url) as proxied:
        want = await sdk_stream(direct, kind, user=new_user("direct"), include_usage=True)
        got = await sdk_stream(proxied, kind, user=new_user("text"), include_usage=True)
    assert want.text, "the model produced no text"
    assert got.text == want.text
    assert got.usage is not None and want.usage is not None
    assert got.usage["completion_tokens"] == want.usage["completion_tokens"]
    (rec,) = await llmtop.records_for([got.user])
    assert rec["outcome"] == "ok" and rec["status"] == 200 and rec["stream"] is True
    assert rec["model"] == MODEL
    assert rec["completion_tokens"] == got.usage["completion_tokens"]
    assert rec["prompt_tokens"] == got.usage["prompt_tokens"]
    assert rec["token_source"] == "usage"
    # the engine's id of the answer, as the client read it in every chunk: what to look up
    # in llama.cpp's log
    assert len(got.ids) == 1 and rec["upstream_id"] == next(iter(got.ids)), got.ids


# -- bytes: compare what llmtop received with what its client received ---------------------


@pytest.fixture
async def teed(engine: Any, tmp_path: Path) -> AsyncIterator[tuple[Tee, LlmtopProcess]]:
    """engine ← Tee ← llmtop ← client: the tee keeps every byte llmtop received."""
    async with teed_llmtop(engine.url, tmp_path / "teed.jsonl") as pair:
        yield pair


CASES = [
    ("/v1/chat/completions", {"messages": CHAT}, True),
    ("/v1/chat/completions", {"messages": CHAT}, False),
    ("/v1/chat/completions", {"messages": CHAT}, False),
    ("/v1/completions", {"prompt": PROMPT}, True),
    ("/v1/completions", {"prompt": PROMPT}, False),
]


async def test_bytes_pass_through_unchanged_and_usage_is_the_servers(
    engine: Any, teed: tuple[Tee, LlmtopProcess]
) -> None:
    """Byte-exactness on a real engine, for the SAME request (ids and timestamps differ
    between two requests, so two requests cannot be compared byte for byte): a plain tee
    between llmtop and llama.cpp keeps the bytes llmtop read, the client keeps the bytes it
    read, and their SHA-256 must be equal. When the client did not ask for usage, llmtop
    adds ``stream_options.include_usage`` upstream and removes exactly the usage-only event:
    the client's bytes equal the upstream bytes less that one event. But llama.cpp then moves
    its ``timings`` from the finish event into that usage event: llmtop puts them back on
    the finish event (the client's bytes are then llama.cpp's without ``include_usage``) and
    stops asking this upstream from then on, and the bytes pass through whole, the
    counts coming from the finish event's ``timings``. Either way llmtop's recorded
    ``completion_tokens`` is the server's own count for that very request (its usage, and
    ``timings.predicted_n``). (llama.cpp's legacy completions carry usage on their finish
    chunk whether asked or not: nothing to remove.)"""
    tee, proc = teed
    injected_chat = False
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for path, body, client_usage in CASES:
            await wait_engine_idle(session, engine.url)
            user = new_user("bytes")
            payload: dict[str, Any] = {
                "model": MODEL, "stream": True, "max_tokens": 20, "temperature": 0, "seed": 1,
                **body,
            }  # fmt: skip
            if client_usage:
                payload["stream_options"] = {"include_usage": True}
            before = len(tee.exchanges)
            got = bytearray()
            async with session.post(
                f"{proc.proxy_url}{path}", json=payload, headers={USER_HEADER: user}
            ) as resp:
                assert resp.status == 200, await resp.text()
                async for data in resp.content.iter_any():
                    got += data
            (ex,) = [e for e in tee.exchanges[before:] if e.path == path]
            upstream = bytes(ex.response_body)
            sent = json.loads(ex.request_body)
            usage = usage_of(upstream)
            timings = timings_of(upstream)
            assert timings is not None, f"the server sent no timings for {path} {sent}"
            assert upstream.endswith(b"data: [DONE]\n\n")
            if client_usage:
                assert usage is not None
                assert hashlib.sha256(got).hexdigest() == hashlib.sha256(upstream).hexdigest()
            elif sent.get("stream_options", {}).get("include_usage") is True:
                # llmtop asked for usage: it removed exactly the usage-only event — once; the
                # timings in it tell llmtop to stop asking this upstream
                assert not injected_chat, "llmtop kept asking after losing the client timings"
                assert usage is not None
                assert not has_usage_only_event(bytes(got)), "the client got an extra usage event"
                # (llama.cpp's timings, moved into the usage event, put back on the finish
                # event: the client's bytes are llama.cpp's answer without include_usage)
                assert bytes(got) == llamacpp_without_usage(upstream)
                if path == "/v1/chat/completions":
                    injected_chat = True
                    assert has_usage_only_event(upstream) and usage_of(bytes(got)) is None
                else:
                    assert bytes(got) == upstream
            else:
                assert hashlib.sha256(got).hexdigest() == hashlib.sha256(upstream).hexdigest()
                if path == "/v1/chat/completions":
                    assert b'"timings"' in bytes(got)
            (rec,) = await proc.records_for([user])
            assert rec["token_source"] == "usage"
            assert rec["completion_tokens"] == timings["predicted_n"]
            if usage is not None:
                assert rec["completion_tokens"] == usage["completion_tokens"]
                assert rec["prompt_tokens"] == usage["prompt_tokens"]
            else:
                assert rec["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
            assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]


# -- timings: the proxy's TTFT/E2E are what the client measured ----------------------------


def _figures(diffs: list[float]) -> str:
    a = [abs(d) for d in diffs]
    return (
        f"p50 {percentile(diffs, 50) * 1e3:.2f} ms, p99|d| {percentile(a, 99) * 1e3:.2f} ms, "
        f"max|d| {max(a) * 1e3:.2f} ms, min {min(diffs) * 1e3:.2f} ms, n={len(diffs)}"
    )


async def test_proxy_timings_agree_with_the_client_chunk_by_chunk(
    engine: Any, llmtop: LlmtopProcess
) -> None:
    """For the same requests, each content chunk's time as llmtop wrote it and as the
    client read it, and the TTFT and E2E llmtop recorded and the client measured (from
    when its HTTP layer began sending the request to the read that brought the first
    content / the end of the body), agree within 5 ms (see ``AGREE_S``/``P99_S``).

    The client is the openai SDK; its clock is read in its HTTP layer (``TimedTransport``),
    and the SDK's own chunk times (after its SSE/JSON/pydantic work) are printed beside."""
    runs: list[ClientRun] = []
    async with openai_client(llmtop.proxy_url) as client, aiohttp.ClientSession() as session:
        await sdk_stream(client, "chat", user=new_user("warm"), max_tokens=4)  # warm connection
        # the client's own garbage collections (tens of ms in a test process this size)
        # would stall its reads; llmtop does the same for itself (gc.freeze after start-up)
        gc.collect()
        gc.freeze()
        gc.disable()
        started = time.monotonic()
        try:
            for i in range(TIMING_REQUESTS):
                await wait_engine_idle(session, engine.url)
                kind = "chat" if i % 2 == 0 else "completions"
                # ignore_eos: every token is a content event, so usage = events and each
                # event can be matched to the read that carried it by the per-chunk counts
                runs.append(
                    await sdk_stream(
                        client, kind, user=new_user("timing"), max_tokens=TIMING_TOKENS,
                        extra_body={"ignore_eos": True},
                    )
                )  # fmt: skip
        finally:
            took = time.monotonic() - started
            gc.enable()
            gc.unfreeze()
    records = await llmtop.records_for([r.user for r in runs])
    diffs: dict[str, list[float]] = {
        name: [] for name in ("chunk", "ttft", "e2e", "t0-send", "sdk chunk", "sdk ttft", "sdk e2e")
    }
    for run, rec in zip(runs, records, strict=True):
        # one proxy chunk per upstream read; a read may carry several of llama.cpp's
        # one-token events (the client then reads them at the same moment too)
        assert sum(rec["chunk_tokens"]) == len(run.chunk_times) == rec["completion_tokens"]
        proxy_times = [
            rec["t_start"] + off
            for off, k in zip(rec["chunk_offsets_s"], rec["chunk_tokens"], strict=True)
            for _ in range(k)
        ]
        diffs["chunk"] += [c - p for c, p in zip(run.chunk_times, proxy_times, strict=True)]
        diffs["ttft"].append((run.chunk_times[0] - run.t_send) - rec["ttft_s"])
        diffs["e2e"].append((run.t_end - run.t_send) - rec["e2e_s"])
        diffs["t0-send"].append(rec["t_start"] - run.t_send)
        diffs["sdk chunk"] += [c - p for c, p in zip(run.sdk_chunk_times, proxy_times, strict=True)]
        diffs["sdk ttft"].append((run.sdk_chunk_times[0] - run.t_send) - rec["ttft_s"])
        diffs["sdk e2e"].append((run.sdk_t_end - run.t_send) - rec["e2e_s"])
    print(
        f"\nclient - proxy, {len(runs)} requests x {TIMING_TOKENS} tokens in {took:.1f} s, "
        f"load average {os.getloadavg()[0]:.2f} (p99 bound {P99_S * 1e3:g} ms):"
    )
    for name, d in diffs.items():
        print(f"  {name:9s} {_figures(d)}")
    report = {name: _figures(d) for name, d in diffs.items()}
    for name in ("chunk", "ttft", "e2e"):
        magnitudes = [abs(d) for d in diffs[name]]
        assert percentile(magnitudes, 50) <= AGREE_S, (name, report)
        assert percentile(magnitudes, 99) <= P99_S, (name, report)
