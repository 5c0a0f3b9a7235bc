"""The Responses API (``POST /v1/responses``) of the real llama.cpp server through ``llmtop
run --headless``, with the openai SDK as the client: the record's ``completion_tokens`` and
``prompt_tokens`` are the engine's ``usage.output_tokens``/``input_tokens``, TTFT is set
(the first text delta, not ``response.created``), and the answer is a direct request's.
Also checks that the captured fixtures (``tests/fixtures/dialects/llamacpp_responses*``)
are still what the server sends for ``CAPTURES``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from e2e_support import MODEL, USER_HEADER, LlmtopProcess, load_real_engine, new_user

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
real_engine = load_real_engine()
RESP = "/v1/responses"
_ASK: dict[str, Any] = {"model": MODEL, "input": "Say hello to a new colleague.",
                        "max_output_tokens": 24, "temperature": 0, "seed": 1}
CAPTURES: dict[str, dict[str, Any]] = {
    "llamacpp_responses_stream.sse": {**_ASK, "stream": True},
    "llamacpp_responses.json": _ASK,
}
"""Fixture file → the request body it was captured with (POST /v1/responses)."""


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="e2e-not-a-secret",
                              max_retries=0)


async def _stream(base: str, user: str) -> tuple[list[str], dict[str, Any]]:
    """The text deltas and the terminal event's usage of one streamed request."""
    async with _client(base) as client:
        stream = await client.responses.create(
            model=MODEL, input="Write one short sentence about the sea.",
            max_output_tokens=24, temperature=0, stream=True,
            extra_headers={USER_HEADER: user}, extra_body={"seed": 1})
        deltas: list[str] = []
        usage: dict[str, Any] = {}
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete"):
                assert event.response.usage is not None
                usage = event.response.usage.model_dump()
    return deltas, usage


async def test_stream_records_the_engines_usage_and_ttft(
    engine: Any, llmtop: LlmtopProcess
) -> None:
    user = new_user("responses")
    want, _ = await _stream(engine.url, new_user("responses-direct"))
    deltas, usage = await _stream(llmtop.proxy_url, user)
    assert "".join(deltas) == "".join(want) and len(deltas) > 1
    (rec,) = await llmtop.records_for([user])
    assert rec["dialect"] == "openai" and rec["path"] == RESP and rec["stream"] is True
    assert rec["outcome"] == "ok" and rec["status"] == 200 and rec["model"] == MODEL
    assert rec["token_source"] == "usage"
    assert rec["completion_tokens"] == usage["output_tokens"]
    assert rec["prompt_tokens"] == usage["input_tokens"]
    assert sum(rec["chunk_tokens"]) == usage["output_tokens"]
    assert 1 <= len(rec["chunk_offsets_s"]) <= len(deltas)
    assert rec["ttft_s"] is not None and 0 < rec["ttft_s"] <= rec["e2e_s"]
    assert rec["ttft_s"] == pytest.approx(rec["chunk_offsets_s"][0])


async def test_whole_answer_records_the_engines_usage(
    engine: Any, llmtop: LlmtopProcess
) -> None:
    user = new_user("responses-whole")

    def call() -> Any:
        with openai.OpenAI(base_url=f"{llmtop.proxy_url}/v1", api_key="e2e-not-a-secret",
                           max_retries=0) as client:
            return client.responses.create(
                model=MODEL, input="Name a colour.", max_output_tokens=12, temperature=0,
                extra_headers={USER_HEADER: user})

    answer = await asyncio.to_thread(call)
    assert answer.output_text and answer.usage is not None
    (rec,) = await llmtop.records_for([user])
    assert rec["dialect"] == "openai" and rec["stream"] is False and rec["outcome"] == "ok"
    assert rec["completion_tokens"] == answer.usage.output_tokens
    assert rec["prompt_tokens"] == answer.usage.input_tokens
    assert rec["chunk_tokens"] == [answer.usage.output_tokens] and rec["ttft_s"] > 0


def _shape(name: str, raw: bytes) -> Any:
    """What must not change: event types and texts, the answer and the usage counts (ids,
    times, timings and the prompt-cache figures do)."""
    if name.endswith(".json"):
        obj = json.loads(raw)
        return (obj["model"], obj["status"], [(i["type"], i.get("content"))
                                              for i in obj["output"]],
                obj["usage"]["input_tokens"], obj["usage"]["output_tokens"])
    out = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        data = json.loads(block.split(b"data: ", 1)[1])
        usage = (data.get("response") or {}).get("usage") or {}
        out.append((data["type"], data.get("delta"), data.get("text"),
                    usage.get("input_tokens"), usage.get("output_tokens")))
    return out


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_captured_fixtures_are_what_the_server_sends_today(engine: Any, name: str) -> None:
    fresh = real_engine.fetch_raw(engine.url, RESP, CAPTURES[name])
    assert _shape(name, fresh) == _shape(name, (FIXTURES / name).read_bytes())
