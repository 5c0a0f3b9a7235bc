"""The simulator's ``POST /v1/responses`` (the OpenAI Responses API), read the way its real
clients read it: the openai SDK (``responses.create`` and its ``responses.stream`` helper)
and raw SSE; its ground truth is the chat route's (timing, tokens, usage, faults)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
from sim_support import get_json, post_raw, sse_events

from llmtop.sim.server import running_sim
from llmtop.sim.tokens import VOCAB

FAST = {"time_scale": 0.3}
RESP = "/v1/responses"


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def _events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    return [(name, json.loads(data)) for name, data in sse_events(raw)]


async def test_stream_events_in_openai_order_with_usage() -> None:
    """Every event is named by its type and numbered from 0; the created/in-progress
    events, the message's opening, one text delta per token, the closing events, then
    ``response.incomplete`` (``max_output_tokens`` was reached) with the usage — whose
    counts are the engine's (prompt by the chat rule: 3 + 4 + ceil(8 / 4))."""
    async with running_sim("tiny", **FAST) as sim:
        status, headers, raw = await post_raw(
            sim.url + RESP, {"model": "gpt-x", "input": "abcdefgh", "max_output_tokens": 6,
                             "stream": True})
        (truth,) = await get_json(sim.url + "/sim/requests")
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert raw.endswith(b"}\n\n") and b"[DONE]" not in raw
    events = _events(raw)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names = [n for n, _ in events]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 6,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"]
    deltas = [d["delta"] for n, d in events if n == "response.output_text.delta"]
    assert all(d in VOCAB for d in deltas)
    last = events[-1][1]["response"]
    assert last["status"] == "incomplete" and last["model"] == "gpt-x"
    assert last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["output"][0]["content"][0]["text"] == "".join(deltas)
    assert last["usage"]["input_tokens"] == 9 == truth["prompt_tokens"]
    assert last["usage"]["output_tokens"] == 6 == truth["completion_tokens"]
    assert truth["path"] == RESP and truth["stream"] is True
    assert len(truth["chunks"]) == 6 and truth["id"] == last["id"]


async def test_sdk_stream_helper_and_create() -> None:
    """Without ``max_output_tokens`` the answer ends ``response.completed`` and the SDK's
    ``responses.stream`` helper (which checks output indexes and response ids) assembles
    it; ``instructions`` count as a system prompt; the whole answer parses too."""
    async with running_sim("tiny", output_tokens_dist="fixed", output_tokens_mean=5,
                           **FAST) as sim, client(sim.url) as c:
        async with c.responses.stream(model="m", input="hi", instructions="be brief") as st:
            kinds = [e.type async for e in st]
            final = await st.get_final_response()
        whole = await c.responses.create(model="m", input=[
            {"role": "user", "content": [{"type": "input_text", "text": "abcdefgh"}]}])
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 5
    assert final.status == "completed" and final.output_text.strip()
    assert final.usage is not None
    # 3 + (4 + ceil(8 / 4)) for the instructions + (4 + 1) for "hi"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (14, 5)
    assert whole.object == "response" and whole.status == "completed"
    assert whole.output_text.strip() and whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (9, 5)


async def test_created_goes_out_before_the_first_token() -> None:
    """``response.created`` is sent with the headers, while the request still waits for a
    slot: it is never what a client would take for the first token."""
    async with running_sim("tiny", max_num_seqs=1) as sim, aiohttp.ClientSession() as s:
        # the first request holds the only slot for ~12 s (1000 tokens at ~12 ms)
        body = {"model": "m", "input": "x", "max_output_tokens": 1000, "stream": True}
        first = await s.post(sim.url + RESP, json=body)
        await first.content.readuntil(b"response.output_text.delta")
        queued = await s.post(sim.url + RESP, json=body)
        head = await queued.content.readuntil(b"event: response.in_progress\n")
        truth = await get_json(sim.url + "/sim/requests")
        assert b"event: response.created\n" in head
        assert truth[1]["first_token"] is None and truth[1]["admitted"] is None
        queued.close()
        first.close()
        await asyncio.sleep(0.05)


async def test_errors_are_openai_errors() -> None:
    async with running_sim("tiny", **FAST) as sim, client(sim.url) as c:
        status, _, raw = await post_raw(sim.url + RESP, {"model": "m", "input": 5})
        assert status == 400
        err = json.loads(raw)["error"]
        assert err["type"] == "BadRequestError" and "'input'" in err["message"]
        status, _, raw = await post_raw(sim.url + RESP, {"model": "m", "input": "x"},
                                        headers={"X-Sim-Fault": "status:429"})
        assert status == 429 and json.loads(raw)["error"]["type"] == "RateLimitError"
        try:
            await c.responses.create(model="m", input="x", max_output_tokens=0)
        except openai.BadRequestError as exc:
            assert "max_tokens must be at least 1" in str(exc)
        else:
            raise AssertionError("max_output_tokens 0 was accepted")


async def test_faults_act_as_on_the_chat_route() -> None:
    """A malformed event after two deltas, then the stream goes on; a disconnect after
    three deltas leaves the stream without its terminal event."""
    async with running_sim("tiny", **FAST) as sim:
        body = {"model": "m", "input": "x", "max_output_tokens": 5, "stream": True}
        _, _, raw = await post_raw(sim.url + RESP, body,
                                   headers={"X-Sim-Fault": "malformed-after:2"})
        assert b'"delta":"broken\n\n' in raw and raw.endswith(b"}\n\n")
        assert raw.count(b"event: response.output_text.delta") == 6  # 5 + the broken one
        data = b""
        try:
            async with aiohttp.ClientSession() as s, s.post(
                    sim.url + RESP, json=body,
                    headers={"X-Sim-Fault": "disconnect-after:3"}) as r:
                async for chunk in r.content.iter_any():
                    data += chunk
        except aiohttp.ClientPayloadError:
            pass
        assert data.count(b"event: response.output_text.delta") == 3
        assert b"response.incomplete" not in data and b"response.completed" not in data
