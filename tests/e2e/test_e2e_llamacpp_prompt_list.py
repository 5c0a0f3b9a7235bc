"""A list of prompts on ``/v1/completions`` from the real llama.cpp server through
``llmtop run --headless``: the record's prompt tokens are every prompt's, each once.

llama.cpp answers each prompt (``n`` choices each; choice ``i`` answers prompt ``i // n``)
with its own usage on each choice's finish event, its own prompt's ``prompt_tokens``, and
sums nothing; llmtop took the last figure (one prompt's). It now sums them per prompt,
knowing from the request body that it held a list. The prompts' token counts are checked
against llama.cpp's own ``/tokenize``. Not streamed, llama.cpp's usage is the first
prompt's first choice's alone: llmtop takes it as it is (a lower bound, nothing made up).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from e2e_support import MODEL, USER_HEADER, LlmtopProcess, new_user, sse_events

PROMPTS = ["The sky is", "One two three four five six", "Colourless green ideas sleep"]


async def _tokens(session: aiohttp.ClientSession, engine_url: str, text: str) -> int:
    async with session.post(f"{engine_url}/tokenize", json={"content": text}) as resp:
        assert resp.status == 200
        return len((await resp.json())["tokens"])


@pytest.mark.parametrize("n", [1, 2])
async def test_a_list_of_prompts_counts_every_prompt_once(
    engine: Any, llmtop: LlmtopProcess, n: int
) -> None:
    streamed, whole = new_user(f"prompts-stream-n{n}"), new_user(f"prompts-whole-n{n}")
    body = {"model": MODEL, "prompt": PROMPTS, "n": n, "max_tokens": 4, "temperature": 0,
            "seed": 1}
    async with aiohttp.ClientSession() as session:
        sizes = [await _tokens(session, engine.url, p) for p in PROMPTS]
        async with session.post(f"{llmtop.proxy_url}/v1/completions",
                                json={**body, "stream": True},
                                headers={USER_HEADER: streamed}) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        async with session.post(f"{llmtop.proxy_url}/v1/completions", json=body,
                                headers={USER_HEADER: whole}) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
    assert len(set(sizes)) == len(sizes)  # different sizes: any prompt's alone is wrong
    events = [json.loads(p) for p in sse_events(raw) if p not in (b"[DONE]", b"null")]
    finishes = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert sorted(e["choices"][0]["index"] for e in finishes) == list(range(n * len(PROMPTS)))
    assert all("usage" in e for e in finishes), "llama.cpp no longer sends usage per choice"
    per_prompt = {e["choices"][0]["index"] // n: e["usage"]["prompt_tokens"] for e in finishes}
    assert [per_prompt[i] for i in range(len(PROMPTS))] == sizes  # each its own prompt's
    rec, rec_whole = await llmtop.records_for([streamed, whole])
    assert rec["outcome"] == "ok" and rec["token_source"] == "usage"
    assert rec["prompt_tokens"] == sum(sizes)  # every prompt, once (not the last one's)
    assert rec["completion_tokens"] == sum(e["usage"]["completion_tokens"] for e in finishes)
    # not streamed: llama.cpp's usage is the first prompt's (and its first choice's) alone
    assert len(answer["choices"]) == n * len(PROMPTS)
    assert answer["usage"]["prompt_tokens"] == sizes[0]
    assert rec_whole["outcome"] == "ok" and rec_whole["token_source"] == "usage"
    assert rec_whole["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert rec_whole["completion_tokens"] == answer["usage"]["completion_tokens"]
