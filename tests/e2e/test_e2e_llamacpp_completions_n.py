"""Legacy completions with ``n: 2`` from the real llama.cpp server through ``llmtop run
--headless``: the record counts both choices when streamed (each choice's finish event
carries that choice's usage), and takes llama.cpp's own usage, choice 0's alone, when not
(see ``llmtop/proxy/dialects/openai.py``). The bytes pass through unchanged."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from e2e_support import MODEL, PROMPT, USER_HEADER, LlmtopProcess, new_user, sse_events

BODY: dict[str, Any] = {
    "model": MODEL,
    "prompt": PROMPT,
    "n": 2,
    "max_tokens": 8,
    "temperature": 1.0,
    "seed": 2,
}


async def test_completions_n2_count_both_choices(llmtop: LlmtopProcess) -> None:
    streamed, whole = new_user("cmpl-n2-stream"), new_user("cmpl-n2-whole")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{llmtop.proxy_url}/v1/completions",
            json={**BODY, "stream": True},
            headers={USER_HEADER: streamed},
        ) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        async with session.post(
            f"{llmtop.proxy_url}/v1/completions", json=BODY, headers={USER_HEADER: whole}
        ) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
    events = [json.loads(p) for p in sse_events(raw) if p != b"[DONE]"]
    finishes = [e for e in events if e["choices"][0]["finish_reason"]]
    assert sorted(e["choices"][0]["index"] for e in finishes) == [0, 1]
    assert all("usage" in e for e in finishes), "llama.cpp no longer sends usage per choice"
    per_choice = [e["usage"]["completion_tokens"] for e in finishes]
    rec, rec_whole = await llmtop.records_for([streamed, whole])
    assert rec["token_source"] == "usage"
    assert rec["completion_tokens"] == sum(per_choice)  # not the last choice's alone
    assert rec["prompt_tokens"] == finishes[-1]["usage"]["prompt_tokens"]
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]
    # not streamed: usage and timings of choice 0 only, taken as they are
    assert len(answer["choices"]) == 2
    assert answer["usage"]["completion_tokens"] == answer["timings"]["predicted_n"]
    assert rec_whole["token_source"] == "usage"
    assert rec_whole["completion_tokens"] == answer["usage"]["completion_tokens"]
