"""Anthropic, Ollama, TGI and plain dialects: the cases the fixtures do not cover."""

from __future__ import annotations

import json
from typing import Any

from llmtop.proxy.dialects.anthropic import (
    AnthropicBodyParser,
    AnthropicStreamParser,
    inspect_anthropic_request,
)
from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser, inspect_tgi_request


def run(p: StreamParser, data: bytes) -> tuple[int, int]:
    a = p.feed(data)
    b = p.finish()
    return (a[0] + b[0], a[1] + b[1])


def j(o: Any) -> bytes:
    return json.dumps(o).encode()


# -- plain ------------------------------------------------------------------------------

def test_plain_counts_the_first_non_empty_read_once_without_tokens() -> None:
    p = PlainParser()
    assert p.feed(b"") == (0, 0)
    assert p.feed(b"x") == (1, 0)
    assert p.feed(b"yyyy") == (0, 0)
    assert p.finish() == (0, 0)
    assert (p.usage_seen, p.usage_completion_tokens, p.model, p.error) == (
        False, None, None, None)
    assert PlainParser().finish() == (0, 0)  # an empty body has no first byte


# -- anthropic --------------------------------------------------------------------------

def test_anthropic_without_event_lines_uses_the_data_type() -> None:
    data = b"".join(b"data: " + j(o) + b"\n\n" for o in [
        {"type": "message_start", "message": {"model": "claude", "usage": {"input_tokens": 3}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": ""}},
        {"type": "message_delta", "usage": {"output_tokens": 2, "input_tokens": 4}},
        {"type": "error", "error": {"type": "api_error", "message": "late"}},
    ])
    p = AnthropicStreamParser()
    assert run(p, data) == (1, 1)
    assert (p.model, p.usage_prompt_tokens, p.usage_completion_tokens) == ("claude", 4, 2)
    assert p.error == "late"


def test_anthropic_error_event_with_non_json_data() -> None:
    p = AnthropicStreamParser()
    run(p, b"event: error\ndata: upstream timed out\n\n")
    assert p.error == "upstream timed out"


def test_anthropic_bodies() -> None:
    p = AnthropicBodyParser()
    p.feed(j({"type": "message", "model": "c", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 10, "output_tokens": 20}}))
    assert p.finish() == (1, 20)
    assert p.usage_prompt_tokens == 15
    p = AnthropicBodyParser()
    p.feed(j({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    assert p.finish() == (0, 0) and p.error == "Overloaded"
    p = AnthropicBodyParser()
    p.feed(j({"type": "message", "content": [{"type": "text", "text": ""}]}))
    assert p.finish() == (0, 0) and p.error is None


def test_anthropic_request() -> None:
    assert inspect_anthropic_request(j({"model": "claude", "stream": True, "metadata": {
        "user_id": "u-9"}})) == RequestInfo(model="claude", user="u-9", stream=True)
    assert inspect_anthropic_request(b"garbage") == RequestInfo()


# -- ollama -----------------------------------------------------------------------------

def test_ollama_crlf_lines_and_whitespace() -> None:
    lines = [{"model": "m", "response": "a", "done": False},
             {"model": "m", "response": "b", "done": False},
             {"model": "m", "response": "", "done": True, "eval_count": 2,
              "prompt_eval_count": 9}]
    data = b"\r\n".join(j(o) for o in lines) + b"\r\n  \r\n"
    p = OllamaStreamParser()
    assert run(p, data) == (2, 2)
    assert (p.usage_completion_tokens, p.usage_prompt_tokens, p.error) == (2, 9, None)


def test_ollama_counts_only_on_done_and_flags_bad_lines() -> None:
    p = OllamaStreamParser()
    p.feed(j({"model": "m", "response": "a", "eval_count": 99}) + b"\n")
    assert not p.usage_seen, "eval_count counts only on the done line"
    p.feed(b"not json\n")
    assert p.error == "malformed JSON line in stream"


def test_ollama_body() -> None:
    p = OllamaBodyParser()
    p.feed(j({"model": "m", "message": {"role": "assistant", "content": ""}, "done": True,
              "eval_count": 0}))
    assert p.finish() == (0, 0) and p.usage_completion_tokens == 0
    p = OllamaBodyParser()
    p.feed(j({"error": "model 'x' not found"}))
    assert p.finish() == (0, 0) and p.error == "model 'x' not found"


# -- tgi --------------------------------------------------------------------------------

def test_tgi_empty_text_token_is_still_one_token_and_special_is_not() -> None:
    data = b"".join(b"data:" + j(o) + b"\n\n" for o in [
        {"token": {"id": 1, "text": "", "special": False}, "generated_text": None},
        {"token": {"id": 2, "text": "<s>", "special": True}, "generated_text": None},
    ])
    assert run(TGIStreamParser(), data) == (1, 1)


def test_tgi_error_event_name() -> None:
    p = TGIStreamParser()
    run(p, b'event: error\ndata: {"message": "queue full"}\n\n')
    assert p.error == "queue full"


def test_tgi_bodies() -> None:
    p = TGIBodyParser()
    p.feed(j([{"generated_text": "hi", "details": {"generated_tokens": 4,
                                                   "input_length": 2}}]))
    assert p.finish() == (1, 4) and p.usage_prompt_tokens == 2
    p = TGIBodyParser()
    p.feed(j({"error": "Input validation error", "error_type": "validation"}))
    assert p.finish() == (0, 0) and p.error == "Input validation error"
    p = TGIBodyParser()
    p.feed(b"[]")
    assert p.finish() == (0, 0) and p.error is None


def test_tgi_request() -> None:
    assert inspect_tgi_request("/generate_stream/", b"") == RequestInfo(stream=True)
    assert inspect_tgi_request("/generate", b'{"inputs": "x"}') == RequestInfo()
