"""llama.cpp's own completion API from the real server through ``llmtop run --headless``:
``POST /completion`` and its alias ``/completions`` (without ``/v1``) take ``n_predict`` and
answer ``{"content", "stop", "tokens_predicted", "tokens_evaluated", "timings"}`` with no
``choices``. The record counts what the engine says it generated, its first chunk is the
first content event the client got, and the text is what a direct request gets."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from e2e_support import PROMPT, USER_HEADER, LlmtopProcess, new_user, sse_events

N_PREDICT = 6


def _body(stream: bool) -> dict[str, Any]:
    return {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0.0, "seed": 3,
            "stream": stream}


@pytest.mark.parametrize("path", ["/completions", "/completion"])
async def test_native_completion_is_counted_as_the_engine_counts(
    llmtop: LlmtopProcess, engine: Any, path: str
) -> None:
    streamed, whole = new_user("native-stream"), new_user("native-whole")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{llmtop.proxy_url}{path}", json=_body(True), headers={USER_HEADER: streamed}
        ) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        async with session.post(
            f"{llmtop.proxy_url}{path}", json=_body(False), headers={USER_HEADER: whole}
        ) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        async with session.post(f"{engine.url}{path}", json=_body(True)) as resp:
            direct = await resp.read()
    events = [json.loads(p) for p in sse_events(raw) if p != b"[DONE]"]
    assert "choices" not in events[0], "llama.cpp's native API now answers OpenAI-style"
    content_events = [e for e in events if e.get("content")]
    last = events[-1]
    assert last["stop"] is True
    # the same text as a direct request (temperature 0): nothing lost or altered
    direct_events = [json.loads(p) for p in sse_events(direct) if p != b"[DONE]"]
    assert [e.get("content") for e in events] == [e.get("content") for e in direct_events]

    rec, rec_whole = await llmtop.records_for([streamed, whole])
    assert rec["stream"] is True
    assert rec["completion_tokens"] == last["tokens_predicted"] == last["timings"]["predicted_n"]
    assert rec["prompt_tokens"] == last["tokens_evaluated"]
    assert rec["token_source"] == "usage"
    # every content event is a chunk, the first one included (TTFT is its arrival)
    assert len(rec["chunk_offsets_s"]) == len(content_events), rec["chunk_offsets_s"]
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]
    assert rec["ttft_s"] == rec["chunk_offsets_s"][0]

    assert answer["content"], answer
    assert rec_whole["stream"] is False
    assert rec_whole["completion_tokens"] == answer["tokens_predicted"]
    assert rec_whole["prompt_tokens"] == answer["tokens_evaluated"]
    assert rec_whole["token_source"] == "usage"
    assert rec_whole["ttft_s"] is not None and rec_whole["ttft_s"] > 0
    assert rec_whole["chunk_tokens"] == [answer["tokens_predicted"]]


async def test_native_prompt_list_counts_every_prompts_completion(
    llmtop: LlmtopProcess, engine: Any
) -> None:
    """A list of prompts is one completion per prompt: streamed, each event carries its
    prompt's ``index`` and each prompt ends with its own ``timings``; not streamed, the
    answer is a JSON list of results. The record sums over the prompts (each prompt's
    tokens its own: they are different prompts)."""
    body = {"prompt": [PROMPT, "The sky is"], "n_predict": N_PREDICT, "temperature": 0.0}
    streamed, whole = new_user("native-list-stream"), new_user("native-list-whole")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{llmtop.proxy_url}/completions", json={**body, "stream": True},
            headers={USER_HEADER: streamed},
        ) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        async with session.post(
            f"{llmtop.proxy_url}/completions", json=body, headers={USER_HEADER: whole}
        ) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
    events = [json.loads(p) for p in sse_events(raw) if p != b"[DONE]"]
    events = [e for e in events if e is not None]  # it may open with "data: null"
    finals = [e for e in events if e.get("stop") is True]
    assert sorted(e["index"] for e in finals) == [0, 1]
    content_events = [e for e in events if e.get("content")]

    rec, rec_whole = await llmtop.records_for([streamed, whole])
    assert rec["completion_tokens"] == sum(e["tokens_predicted"] for e in finals)
    assert rec["prompt_tokens"] == sum(e["tokens_evaluated"] for e in finals)
    assert rec["token_source"] == "usage"
    # the prompts decode side by side: two of their events may arrive in one read (one chunk)
    assert 0 < len(rec["chunk_offsets_s"]) <= len(content_events)
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]

    assert isinstance(answer, list) and len(answer) == 2
    assert rec_whole["completion_tokens"] == sum(a["tokens_predicted"] for a in answer)
    assert rec_whole["prompt_tokens"] == sum(a["tokens_evaluated"] for a in answer)
    assert rec_whole["token_source"] == "usage"
    assert rec_whole["ttft_s"] is not None and rec_whole["ttft_s"] > 0
