"""The machine-readable kind of an upstream's error (``error_kind``), read by every dialect
from error bodies and error events as the engines really write them, and nothing else: a
``type``/``code`` holding free text, a long string, an object, non-ASCII or control
characters is dropped, so no prompt text reaches the record through it."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest

from llmtop.proxy.dialects._common import error_kind, kind_part
from llmtop.proxy.dialects.anthropic import AnthropicBodyParser, AnthropicStreamParser
from llmtop.proxy.dialects.base import StreamParser
from llmtop.proxy.dialects.compressed import InflatingParser
from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
from llmtop.proxy.dialects.openai import OpenAIBodyParser, OpenAIStreamParser
from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser

SECRET = "my secret prompt"


def j(o: Any) -> bytes:
    return json.dumps(o).encode()


def sse(o: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + j(o) + b"\n\n"


def run(p: StreamParser, data: bytes) -> StreamParser:
    p.feed(data)
    p.finish()
    return p


# -- real shapes -----------------------------------------------------------------------

OPENAI_CONTEXT = {"error": {
    "message": f"This model's maximum context length is 4096 tokens. However, your messages "
               f"resulted in 5000 tokens. ({SECRET})",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
OPENAI_MODEL = {"error": {"message": "The model `gpt-9` does not exist or you do not have "
                                     "access to it.",
                          "type": "invalid_request_error", "param": None,
                          "code": "model_not_found"}}
OPENAI_RATE = {"error": {"message": "Rate limit reached for requests", "type": "requests",
                         "param": None, "code": "rate_limit_exceeded"}}
VLLM_BARE = {"object": "error", "message": f"This model's maximum context length is 2048 "
                                           f"tokens ... {SECRET}",
             "type": "BadRequestError", "param": None, "code": 400}
VLLM_NEW = {"error": {"message": f"The model `x` does not exist. {SECRET}",
                      "type": "NotFoundError", "param": "model", "code": 404}}
LLAMACPP_CTX = {"error": {"code": 400, "message": "the request exceeds the available context "
                                                 "size, try increasing it",
                          "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
                          "n_ctx": 4096}}
LLAMACPP_INVALID = {"error": {"code": 400, "message": f"'messages' is required {SECRET}",
                              "type": "invalid_request_error"}}
LLAMACPP_LOADING = {"error": {"code": 503, "message": "Loading model",
                              "type": "unavailable_error"}}
LITELLM = {"error": {"message": "litellm.RateLimitError: ...", "type": None, "param": None,
                     "code": "429"}}
TGI_ON_OPENAI_ROUTE = {"error": f"Input validation error: {SECRET}", "error_type": "validation"}
ANTHROPIC_OVERLOADED = {"type": "error",
                        "error": {"type": "overloaded_error", "message": "Overloaded"},
                        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
ANTHROPIC_TOO_LONG = {"type": "error", "error": {
    "type": "invalid_request_error", "message": f"prompt is too long: {SECRET}"}}
TGI_VALIDATION = {"error": f"Input validation error: `inputs` tokens + `max_new_tokens` must be "
                           f"<= 4096. Given: 5000 ({SECRET})", "error_type": "validation"}
TGI_GENERATION = {"error": "Request failed during generation: Server error: CUDA out of memory",
                  "error_type": "generation"}
TGI_OVERLOADED = {"error": "Model is overloaded", "error_type": "overloaded"}
OLLAMA_MISSING = {"error": f"model \"llama9\" not found, try pulling it first {SECRET}"}


@pytest.mark.parametrize(("make", "body", "kind"), [
    (OpenAIBodyParser, OPENAI_CONTEXT, "invalid_request_error/context_length_exceeded"),
    (OpenAIBodyParser, OPENAI_MODEL, "invalid_request_error/model_not_found"),
    (OpenAIBodyParser, OPENAI_RATE, "requests/rate_limit_exceeded"),
    (OpenAIBodyParser, VLLM_BARE, "BadRequestError/400"),
    (OpenAIBodyParser, VLLM_NEW, "NotFoundError/404"),
    (OpenAIBodyParser, LLAMACPP_CTX, "exceed_context_size_error/400"),
    (OpenAIBodyParser, LLAMACPP_INVALID, "invalid_request_error/400"),
    (OpenAIBodyParser, LLAMACPP_LOADING, "unavailable_error/503"),
    (OpenAIBodyParser, LITELLM, "429"),
    (OpenAIBodyParser, TGI_ON_OPENAI_ROUTE, "validation"),
    (AnthropicBodyParser, ANTHROPIC_OVERLOADED, "overloaded_error"),
    (AnthropicBodyParser, ANTHROPIC_TOO_LONG, "invalid_request_error"),
    (TGIBodyParser, TGI_VALIDATION, "validation"),
    (TGIBodyParser, TGI_OVERLOADED, "overloaded"),
    (TGIBodyParser, [TGI_GENERATION], "generation"),  # the hosted API's one-element list
    (OllamaBodyParser, OLLAMA_MISSING, None),
])
def test_error_body_kind(make: Callable[[], StreamParser], body: Any, kind: str | None) -> None:
    p = run(make(), j(body))
    assert p.error  # the text is still read (recorded only with record_content on)
    assert p.error_kind == kind


@pytest.mark.parametrize(("make", "data", "kind"), [
    # vLLM's mid-stream error event
    (OpenAIStreamParser, sse({"error": {"object": "error", "message": f"boom {SECRET}",
                                        "type": "BadRequestError", "param": None,
                                        "code": 400}}), "BadRequestError/400"),
    (OpenAIStreamParser, sse(LLAMACPP_CTX), "exceed_context_size_error/400"),
    (OpenAIStreamParser, sse({"type": "server_error", "message": SECRET}, event="error"),
     "server_error"),
    (OpenAIStreamParser, b"event: error\ndata: not json " + SECRET.encode() + b"\n\n", None),
    (AnthropicStreamParser, sse(ANTHROPIC_OVERLOADED, event="error"), "overloaded_error"),
    (AnthropicStreamParser, sse({"type": "error", "error": {"type": "api_error",
                                                           "message": SECRET}}), "api_error"),
    (TGIStreamParser, sse(TGI_GENERATION), "generation"),
    (TGIStreamParser, sse({"error": SECRET, "error_type": "incomplete_generation"}),
     "incomplete_generation"),
    (OllamaStreamParser, j({"model": "m", "response": "hi", "done": False}) + b"\n"
     + j(OLLAMA_MISSING) + b"\n", None),
])
def test_error_event_kind(make: Callable[[], StreamParser], data: bytes,
                          kind: str | None) -> None:
    p = run(make(), data)
    assert p.error
    assert p.error_kind == kind


def test_the_kind_belongs_to_the_first_error() -> None:
    p = run(OpenAIStreamParser(), b"data: {broken\n\n" + sse(OPENAI_CONTEXT))
    assert p.error == "malformed JSON in stream event" and p.error_kind is None
    q = run(AnthropicStreamParser(), sse(ANTHROPIC_OVERLOADED, event="error")
            + sse(ANTHROPIC_TOO_LONG, event="error"))
    assert q.error == "Overloaded" and q.error_kind == "overloaded_error"


def test_no_error_no_kind() -> None:
    p = run(OpenAIBodyParser(), j({"model": "m", "choices": [
        {"message": {"content": "type code error"}}], "usage": {"completion_tokens": 3}}))
    assert p.error is None and p.error_kind is None


def test_a_compressed_error_body_gives_its_kind() -> None:
    p = run(InflatingParser(OpenAIBodyParser(), "gzip"), gzip.compress(j(VLLM_BARE)))
    assert p.error and p.error_kind == "BadRequestError/400"


# -- hostile kinds ---------------------------------------------------------------------

HOSTILE: list[object] = [
    SECRET,  # the prompt in the type
    f"Please summarise: {SECRET}",
    "x" * 10240,  # a 10 KB code
    "a" * 65,  # one past the limit
    {"nested": SECRET},
    [SECRET],
    ["invalid_request_error"],
    "café_error",  # non-ASCII
    "ｉｎｖａｌｉｄ",  # fullwidth letters
    "Kelvin_\u212a",  # KELVIN SIGN, which IGNORECASE would let match [a-z]
    "bad\ntype",
    "invalid_request_error\n",  # a trailing newline: "$" would let it through
    "a\x00b",
    "tab\there",
    "\x1b[31mred",
    "1abc",  # neither an identifier nor a number
    "-flag",
    "",
    " ",
    "12345678",  # a number past six digits
    -1,
    10**9,
    1.5,
    True,
    None,
]


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: repr(v)[:24])
def test_kind_part_drops_anything_but_a_short_word(bad: object) -> None:
    assert kind_part(bad) is None


@pytest.mark.parametrize("good", ["invalid_request_error", "BadRequestError", "a" * 64,
                                  "context_length_exceeded", "v1.errors-x", "429", 400, 0])
def test_kind_part_keeps_short_words_and_numbers(good: object) -> None:
    assert kind_part(good) == str(good)


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: repr(v)[:24])
@pytest.mark.parametrize(("make", "shape"), [
    (OpenAIBodyParser, lambda t, c: {"error": {"message": SECRET, "type": t, "code": c}}),
    (OpenAIBodyParser, lambda t, c: {"object": "error", "message": SECRET, "type": t,
                                     "param": None, "code": c}),
    (AnthropicBodyParser, lambda t, c: {"type": "error", "error": {"type": t, "code": c,
                                                                   "message": SECRET}}),
    (TGIBodyParser, lambda t, c: {"error": SECRET, "error_type": t, "code": c}),
    (OllamaBodyParser, lambda t, c: {"error": SECRET, "type": t, "code": c}),
    (OpenAIStreamParser, lambda t, c: {"error": {"message": SECRET, "type": t, "code": c}}),
    (AnthropicStreamParser, lambda t, c: {"type": "error", "error": {"type": t, "code": c,
                                                                     "message": SECRET}}),
    (TGIStreamParser, lambda t, c: {"error": SECRET, "error_type": t, "code": c}),
    (OllamaStreamParser, lambda t, c: {"error": SECRET, "type": t, "code": c}),
], ids=["openai", "vllm", "anthropic", "tgi", "ollama", "openai-sse", "anthropic-sse",
        "tgi-sse", "ollama-ndjson"])
def test_hostile_type_and_code_never_reach_the_kind(
        make: Callable[[], StreamParser], shape: Callable[[object, object], Any],
        bad: object) -> None:
    stream = make in (OpenAIStreamParser, AnthropicStreamParser, TGIStreamParser)
    ndjson = make is OllamaStreamParser

    def parse(o: Any) -> StreamParser:
        data = sse(o) if stream else j(o) + b"\n" if ndjson else j(o)
        return run(make(), data)

    assert parse(shape(bad, bad)).error_kind is None
    # a good part next to a hostile one is kept alone
    assert parse(shape(bad, "context_length_exceeded")).error_kind == "context_length_exceeded"
    assert parse(shape("overloaded_error", bad)).error_kind == "overloaded_error"


def test_error_kind_joins_type_and_code_once() -> None:
    assert error_kind({"type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}) == (
        "rate_limit_exceeded")
    assert error_kind({"type": "error", "code": 500}) == "500"  # Anthropic's envelope word
    assert error_kind({"error_type": "validation"}) == "validation"
    assert error_kind({"type": SECRET, "error_type": "validation"}) == "validation"
    assert error_kind(SECRET) is None and error_kind(None) is None
