"""Anthropic, Ollama and TGI endpoints, parsed the way their real clients parse them."""

from __future__ import annotations

import json

import aiohttp
from sim_support import post_raw, sse_events

from llmtop.sim.server import running_sim
from llmtop.sim.tokens import prompt_tokens

FAST = {"time_scale": 0.3}
MSG = [{"role": "user", "content": "abcdefgh"}]  # 3 + 4 + 2 = 9 prompt tokens


async def test_anthropic_stream_events() -> None:
    """The Anthropic SDK's stream reader keys on ``event:`` names and checks that each
    data's ``type`` matches; text comes from ``text_delta``s; usage from message_start
    (input) and message_delta (output)."""
    async with running_sim("tiny", **FAST) as sim:
        status, headers, raw = await post_raw(
            sim.url + "/v1/messages",
            {"model": "claude-x", "max_tokens": 6, "messages": MSG, "stream": True},
            headers={"anthropic-version": "2023-06-01", "x-api-key": "k"})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [(name, json.loads(data)) for name, data in sse_events(raw)]
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[3:9] == ["content_block_delta"] * 6
    assert names[9:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["role"] == "assistant"
    assert start["model"] == "claude-x"
    assert start["usage"]["input_tokens"] == 9
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" and d["text"] for d in deltas)
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 6


async def test_anthropic_not_streamed_and_errors() -> None:
    async with running_sim("tiny", output_tokens_dist="fixed", output_tokens_mean=3,
                           **FAST) as sim:
        status, _, raw = await post_raw(sim.url + "/v1/messages",
                                        {"model": "c", "max_tokens": 4, "messages": MSG})
        body = json.loads(raw)
        assert status == 200
        assert body["type"] == "message"
        assert body["content"][0]["type"] == "text"
        assert body["content"][0]["text"].strip()
        assert body["usage"] == {"input_tokens": 9, "output_tokens": 4}
        assert body["stop_reason"] == "max_tokens"
        status, _, raw = await post_raw(sim.url + "/v1/messages", {"messages": MSG})
        assert status == 400
        err = json.loads(raw)
        assert err["type"] == "error"
        assert err["error"]["type"] == "invalid_request_error"
        assert "max_tokens" in err["error"]["message"]


async def _ndjson(url: str, body: dict[str, object]) -> tuple[str, list[dict[str, object]]]:
    """Read NDJSON the way the ollama client does: one JSON object per line."""
    out = []
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        async for line in r.content:
            if line.strip():
                out.append(json.loads(line))
    return ctype, out


async def test_ollama_chat_streams_by_default() -> None:
    """Ollama's ``stream`` defaults to true: NDJSON, ``done: true`` last with counts."""
    async with running_sim("tiny", **FAST) as sim:
        ctype, lines = await _ndjson(sim.url + "/api/chat",
                                     {"model": "llama3", "messages": MSG,
                                      "options": {"num_predict": 5}})
    assert ctype.startswith("application/x-ndjson")
    assert [x["done"] for x in lines] == [False] * 5 + [True]
    assert all(x["message"]["role"] == "assistant" for x in lines)  # type: ignore[index]
    assert all(x["message"]["content"] for x in lines[:-1])  # type: ignore[index]
    final = lines[-1]
    assert final["model"] == "llama3"
    assert (final["prompt_eval_count"], final["eval_count"]) == (9, 5)
    assert final["done_reason"] == "length"
    assert isinstance(final["total_duration"], int)
    assert final["total_duration"] >= final["eval_duration"] > 0  # type: ignore[operator]


async def test_ollama_generate_stream_and_not() -> None:
    async with running_sim("tiny", **FAST) as sim:
        _, lines = await _ndjson(sim.url + "/api/generate",
                                 {"model": "m", "prompt": "a" * 20, "options": {"num_predict": 4}})
        status, headers, raw = await post_raw(
            sim.url + "/api/generate",
            {"model": "m", "prompt": "abcd", "stream": False, "options": {"num_predict": 3}})
    assert [x["done"] for x in lines] == [False] * 4 + [True]
    assert "".join(str(x["response"]) for x in lines).strip()
    assert (lines[-1]["prompt_eval_count"], lines[-1]["eval_count"]) == (5, 4)
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    body = json.loads(raw)
    assert body["done"] is True
    assert body["eval_count"] == 3
    assert body["response"].strip()


async def test_tgi_generate_stream() -> None:
    """text_generation's client reads lines starting with ``data:`` and parses the rest; the
    last token's event carries ``generated_text`` and ``details``."""
    async with running_sim("tiny", tokens_per_chunk=2, **FAST) as sim:
        status, _, raw = await post_raw(sim.url + "/generate_stream",
                                        {"inputs": "a" * 12,
                                         "parameters": {"max_new_tokens": 5}})
        _, _, whole = await post_raw(sim.url + "/generate",
                                     {"inputs": "abc", "parameters": {"max_new_tokens": 3}})
    assert status == 200
    events = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            events.append(json.loads(line[5:]))
    assert [e["index"] for e in events] == [1, 2, 3, 4, 5]
    assert all(e["token"]["special"] is False for e in events)
    assert all(e["generated_text"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert events[-1]["details"]["generated_tokens"] == 5
    assert events[-1]["details"]["finish_reason"] == "length"
    assert events[-1]["details"]["input_length"] == 3
    body = json.loads(whole)
    assert body["details"]["generated_tokens"] == 3
    assert body["generated_text"].strip()


async def test_tgi_root_route_as_tgi_answers_it() -> None:
    """TGI's ``POST /`` (``compat_generate``, where its Python clients post by default):
    ``stream`` true is ``/generate_stream``; else ``/generate``'s answer in a one-element
    list. ``/generate``'s ``details`` are TGI's ``Details``: ``prefill`` (the prompt's
    tokens with ``decoder_input_details``, else empty) and one ``tokens`` entry per token,
    no ``input_length`` (that is the stream's ``StreamDetails``)."""
    async with running_sim("tiny", **FAST) as sim:
        status, headers, raw = await post_raw(
            sim.url + "/", {"inputs": "abc", "stream": True,
                            "parameters": {"max_new_tokens": 4}})
        _, _, whole = await post_raw(sim.url + "/", {"inputs": "abc",
                                                     "parameters": {"max_new_tokens": 3}})
        _, _, prefilled = await post_raw(
            sim.url + "/generate", {"inputs": "abcdefgh", "parameters": {
                "max_new_tokens": 2, "decoder_input_details": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(line[5:]) for line in raw.split(b"\n") if line.startswith(b"data:")]
    assert [e["index"] for e in events] == [1, 2, 3, 4]
    assert events[-1]["details"]["generated_tokens"] == 4
    (answer,) = json.loads(whole)
    details = answer["details"]
    assert details["generated_tokens"] == 3 and details["prefill"] == []
    assert "input_length" not in details
    assert "".join(t["text"] for t in details["tokens"]) == answer["generated_text"]
    assert [t["special"] for t in details["tokens"]] == [False] * 3
    prefill = json.loads(prefilled)["details"]["prefill"]
    assert len(prefill) == prompt_tokens("abcdefgh") > 1  # as the engine counted the prompt
    assert prefill[0]["logprob"] is None and prefill[1]["logprob"] < 0
