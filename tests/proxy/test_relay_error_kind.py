"""The record's ``error`` names the upstream's error kind, through the real proxy: an HTTP
4xx/5xx answer is ``upstream answered HTTP 400 (invalid_request_error/...)``, an error
event in a stream ``upstream error event (overloaded_error)`` — so a report tells a context
overflow from a bad model name from a rate limit — while the upstream's message (which may
quote the prompt) is kept only with ``recording.record_content`` on."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from test_proxy_support import Script, running_proxy, scripted_upstream, sse

from llmtop.events import RequestRecord
from llmtop.sim.server import running_sim

SECRET = "my secret prompt"
CHAT = "/v1/chat/completions"
SSE = {"Content-Type": "text/event-stream"}
CONTEXT_400 = {"error": {
    "message": f"This model's maximum context length is 4096 tokens. However, you requested "
               f"5000 tokens ({SECRET}).",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error",
                                         "message": f"Overloaded ({SECRET})"}}


def _leaks(rec: RequestRecord) -> bool:
    return SECRET in json.dumps(rec.to_json_dict())


async def _one(upstream: str, path: str, body: dict[str, Any],
               headers: dict[str, str] | None = None, **overrides: Any) -> RequestRecord:
    async with running_proxy(upstream, **overrides) as (_, url, recs), \
            aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body, headers=headers) as r:
            await r.read()
        (rec,) = await recs.wait(1)
    return rec


async def test_http_error_with_a_kind_without_a_body_and_an_error_event() -> None:
    msg = {"model": "m", "messages": [{"role": "user", "content": SECRET}]}
    async with scripted_upstream() as up:
        up.script = Script(chunks=[json.dumps(CONTEXT_400).encode()], status=400,
                           content_length=True)
        rec = await _one(up.url, CHAT, msg)
        assert rec.outcome == "error" and rec.status == 400
        assert rec.error == ("upstream answered HTTP 400 "
                             "(invalid_request_error/context_length_exceeded)")
        assert not _leaks(rec)

        # a 500 without a JSON body (and a streaming request): no kind, as before
        up.script = Script(chunks=[f"Internal Server Error: {SECRET}".encode()], status=500,
                           headers={"Content-Type": "text/plain"})
        rec = await _one(up.url, CHAT, {**msg, "stream": True})
        assert rec.outcome == "error" and rec.error == "upstream answered HTTP 500"
        assert not _leaks(rec)

        # an Anthropic stream that an overloaded engine ends with an error event
        up.script = Script(headers=SSE, chunks=[
            b"event: message_start\ndata: " + json.dumps({"type": "message_start", "message": {
                "model": "claude", "usage": {"input_tokens": 3}}}).encode() + b"\n\n",
            b"event: error\ndata: " + json.dumps(OVERLOADED).encode() + b"\n\n"])
        rec = await _one(up.url, "/v1/messages", {**msg, "stream": True})
        assert rec.outcome == "error" and rec.status == 200
        assert rec.error == "upstream error event (overloaded_error)"
        assert not _leaks(rec)

        # vLLM's error event in an OpenAI stream
        up.script = Script(headers=SSE, chunks=[sse({"error": {
            "object": "error", "message": SECRET, "type": "BadRequestError", "param": None,
            "code": 400}})])
        rec = await _one(up.url, CHAT, {**msg, "stream": True})
        assert rec.error == "upstream error event (BadRequestError/400)"
        assert not _leaks(rec)


@pytest.mark.parametrize("kind", [SECRET, "x" * 10240, {"text": SECRET}, "bad\ttype"],
                         ids=["prompt", "10k", "object", "control"])
async def test_a_hostile_kind_is_not_recorded(kind: object) -> None:
    body = {"error": {"message": SECRET, "type": kind, "code": kind}}
    async with scripted_upstream() as up:
        up.script = Script(chunks=[json.dumps(body).encode()], status=400, content_length=True)
        rec = await _one(up.url, CHAT, {"model": "m"})
        assert rec.error == "upstream answered HTTP 400"
        up.script = Script(headers=SSE, chunks=[sse(body)])
        rec2 = await _one(up.url, CHAT, {"model": "m", "stream": True})
        assert rec2.error == "upstream error event"
        # next to a good part, the hostile one is dropped alone
        mixed = {"error": {"message": SECRET, "type": kind, "code": "context_length_exceeded"}}
        up.script = Script(chunks=[json.dumps(mixed).encode()], status=400,
                           content_length=True)
        rec3 = await _one(up.url, CHAT, {"model": "m"})
        assert rec3.error == "upstream answered HTTP 400 (context_length_exceeded)"
    assert not _leaks(rec) and not _leaks(rec2) and not _leaks(rec3)


async def test_with_content_opted_in_the_message_follows_the_kind() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[json.dumps(CONTEXT_400).encode()], status=400,
                           content_length=True)
        rec = await _one(up.url, CHAT, {"model": "m"}, recording__record_content=True)
        assert rec.error == ("upstream answered HTTP 400 (invalid_request_error/"
                             f"context_length_exceeded): {CONTEXT_400['error']['message']}")
        up.script = Script(headers=SSE, chunks=[b"event: error\ndata: "
                                                + json.dumps(OVERLOADED).encode() + b"\n\n"])
        rec = await _one(up.url, "/v1/messages", {"model": "m", "stream": True},
                         recording__record_content=True)
        assert rec.error == f"upstream error event (overloaded_error): Overloaded ({SECRET})"
        # llmtop's own finding on an error page is no upstream message
        up.script = Script(chunks=[b"<html>502 Bad Gateway</html>"], status=502,
                           content_length=True)
        rec = await _one(up.url, CHAT, {"model": "m"}, recording__record_content=True)
        assert rec.error == "upstream answered HTTP 502"


@pytest.mark.parametrize(("path", "status", "error"), [
    (CHAT, 400, "upstream answered HTTP 400 (BadRequestError/400)"),
    (CHAT, 429, "upstream answered HTTP 429 (RateLimitError/429)"),
    ("/v1/messages", 529, "upstream answered HTTP 529 (overloaded_error)"),
    ("/generate", 400, "upstream answered HTTP 400 (validation)"),
    ("/api/chat", 500, "upstream answered HTTP 500"),  # Ollama's errors have no kind
])
async def test_simulator_error_statuses(path: str, status: int, error: str) -> None:
    body = {"model": "sim-tiny", "stream": False, "inputs": "hi", "max_tokens": 4,
            "messages": [{"role": "user", "content": SECRET}]}
    async with running_sim("tiny", seed=1) as sim:
        rec = await _one(sim.url, path, body, headers={"X-Sim-Fault": f"status:{status}"})
    assert rec.outcome == "error" and rec.status == status and rec.error == error
    assert not _leaks(rec)


async def test_a_broken_compressed_body_is_llmtops_finding_not_an_upstream_error() -> None:
    """The inflating parser's own finding used to be recorded as ``upstream error event``."""
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"\x1f\x8b\x08\x00not gzip at all"],
                           headers={**SSE, "Content-Encoding": "gzip"})
        async with running_proxy(up.url) as (_, url, recs), \
                aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(url + CHAT, json={"model": "m", "stream": True}) as r:
                await r.read()
            (rec,) = await recs.wait(1)
    assert rec.outcome == "error"
    assert rec.error == "malformed stream: malformed compressed body"
