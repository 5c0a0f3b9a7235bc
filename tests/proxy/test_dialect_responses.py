"""The OpenAI Responses API (``/v1/responses``) as a measured ``openai`` stream: which
routes are parsed, what the request says, and the parser's edges that the golden fixtures
(tests/proxy/test_dialect_fixtures.py) do not show — error kinds, end markers, events
skipped, error bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmtop.proxy.dialects import StreamParser, detect_dialect, inspect_request, make_parser
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.openai import OpenAIBodyParser, OpenAIStreamParser
from llmtop.proxy.dialects.openai_responses import (
    ResponsesBodyParser,
    ResponsesStreamParser,
    is_responses_path,
)

SSE = "text/event-stream"
RESP = "/v1/responses"


def ev(typ: str, name: str | None = None, **fields: Any) -> bytes:
    """One event as the API writes it (``name`` None: the type; "" for no ``event:`` line)."""
    data = json.dumps({"type": typ, **fields}, separators=(",", ":")).encode()
    name = typ if name is None else name
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + data + b"\n\n"


def stream(*events: bytes) -> tuple[int, int, StreamParser]:
    parser = make_parser("openai", True, SSE, RESP)
    n, t = parser.feed(b"".join(events))
    m, u = parser.finish()
    return n + m, t + u, parser


def body(obj: Any) -> tuple[tuple[int, int], StreamParser]:
    parser = make_parser("openai", False, "application/json", RESP)
    parser.feed(json.dumps(obj).encode())
    return parser.finish(), parser


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/v1/responses", "openai"),
    ("POST", "/openai/v1/responses/", "openai"),
    ("POST", "/v1/Responses?api-version=1", "openai"),
    ("POST", "/v1/responses/input_tokens", "other"),
    ("POST", "/v1/responses/resp_123/cancel", "other"),
    ("POST", "/v1/responses/resp_123", "other"),
    ("GET", "/v1/responses/resp_123", "other"),
    ("GET", "/v1/responses", "other"),
    ("DELETE", "/v1/responses/resp_123", "other"),
    ("GET", "/v1/responses/resp_123/input_items", "other"),
])
def test_only_the_create_route_is_a_measured_stream(method: str, path: str, want: str) -> None:
    assert detect_dialect(method, path, "application/json") == want


def test_the_path_chooses_the_openai_parsers() -> None:
    assert is_responses_path("/v1/responses") and not is_responses_path("/v1/responses/x")
    assert isinstance(make_parser("openai", True, SSE, RESP), ResponsesStreamParser)
    assert isinstance(make_parser("openai", False, "application/json", RESP),
                      ResponsesBodyParser)
    assert isinstance(make_parser("openai", True, SSE, "/v1/chat/completions"),
                      OpenAIStreamParser)
    assert isinstance(make_parser("openai", True, SSE), OpenAIStreamParser)  # no path given
    # a configured dialect other than openai keeps its own parser on any path
    assert not isinstance(make_parser("anthropic", True, SSE, RESP), ResponsesStreamParser)
    # …/responses/{id}/cancel answers a Response object: under a configured openai dialect
    # it is read as a chat body, as before (it carries no new output)
    assert isinstance(make_parser("openai", False, "application/json", RESP + "/r/cancel"),
                      OpenAIBodyParser)


def test_request_model_stream_and_user() -> None:
    raw = json.dumps({"model": "gpt-5", "input": "hi", "stream": True, "user": "alice",
                      "safety_identifier": "sid-1", "prompt_cache_key": "k"}).encode()
    assert inspect_request("openai", RESP, raw) == RequestInfo(
        model="gpt-5", user="alice", stream=True, sends_usage=True)
    # interfaces.md names the body's ``user`` field; safety_identifier is not read as one
    raw = json.dumps({"model": "m", "input": "hi", "safety_identifier": "sid-1"}).encode()
    assert inspect_request("openai", RESP, raw) == RequestInfo(model="m", sends_usage=True)
    assert inspect_request("openai", RESP, b"not json") == RequestInfo(sends_usage=True)
    # chat completions are unchanged: no sends_usage, so usage may be asked for there
    chat = inspect_request("openai", "/v1/chat/completions", b'{"stream": true}')
    assert chat == RequestInfo(stream=True)


def test_error_event_sets_error_and_its_code_as_kind() -> None:
    n, t, p = stream(ev("response.output_text.delta", delta="Hi"),
                     ev("error", code="rate_limit_exceeded", param=None,
                        message="Rate limit reached", sequence_number=2))
    assert (n, t) == (1, 1)
    assert p.error == "Rate limit reached" and p.error_kind == "rate_limit_exceeded"
    assert not p.ended  # an error event is not the stream's end marker
    # an error object inside the event (as some servers nest it)
    _, _, p = stream(ev("error", error={"type": "invalid_request_error",
                                       "code": "context_length_exceeded",
                                       "message": "Too long"}))
    assert p.error == "Too long"
    assert p.error_kind == "invalid_request_error/context_length_exceeded"


def test_response_failed_sets_error_usage_and_ends() -> None:
    failed = {"id": "r", "status": "failed", "model": "m",
              "error": {"code": "server_error", "message": "The model failed."},
              "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}
    n, _, p = stream(ev("response.output_text.delta", delta="a"),
                     ev("response.failed", response=failed))
    assert n == 1 and p.ended
    assert (p.error, p.error_kind) == ("The model failed.", "server_error")
    assert (p.usage_prompt_tokens, p.usage_completion_tokens, p.model) == (5, 2, "m")
    # failed without an error object still fails the stream
    _, _, p = stream(ev("response.failed", response={"status": "failed", "error": None}))
    assert p.error == "response failed" and p.error_kind is None


def test_incomplete_is_a_normal_end_with_usage() -> None:
    inc = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
           "error": None, "model": "m", "usage": {"input_tokens": 9, "output_tokens": 4}}
    n, t, p = stream(*(ev("response.output_text.delta", delta=w) for w in "abcd"),
                     ev("response.incomplete", response=inc))
    assert (n, t) == (4, 4) and p.ended and p.error is None
    assert (p.usage_prompt_tokens, p.usage_completion_tokens) == (9, 4)


def test_done_marker_some_gateways_append_is_no_malformed_json() -> None:
    n, _, p = stream(ev("response.output_text.delta", delta="x"),
                     ev("response.completed", response={"usage": {"output_tokens": 1}}),
                     b"data: [DONE]\n\n")
    assert n == 1 and p.error is None and p.ended and p.usage_completion_tokens == 1


def test_malformed_json_in_a_read_event_fails_the_stream() -> None:
    n, _, p = stream(ev("response.output_text.delta", delta="x"),
                     b'event: response.output_text.delta\ndata: {"type": "response.out\n\n')
    assert n == 1 and p.error == "malformed JSON in stream event" and p.error_kind is None


def test_events_not_read_are_not_decoded() -> None:
    """The ``*.done`` events repeat the whole text: by their ``event:`` name they are
    skipped unread (so even broken JSON in one is not an error); without a name the data's
    type decides, and a ``.done`` there is decoded and is no content."""
    n, _, p = stream(b"event: response.output_text.done\ndata: {not json\n\n",
                     ev("response.output_text.done", text="whole text"),
                     ev("response.output_text.done", name="", text="whole text"))
    assert n == 0 and p.error is None
    # a generic name (``event: message``, as a gateway may write) is no type: the data's is
    n, _, p = stream(ev("response.output_text.delta", name="message", delta="a"),
                     ev("response.completed", name="message",
                        response={"usage": {"output_tokens": 1}}))
    assert n == 1 and p.usage_completion_tokens == 1 and p.ended


def test_tool_calls_start_at_their_name_other_items_do_not() -> None:
    n, _, _ = stream(
        ev("response.output_item.added", output_index=0,
           item={"type": "message", "id": "m", "role": "assistant", "content": []}),
        ev("response.output_item.added", output_index=1,
           item={"type": "reasoning", "id": "rs", "summary": []}),
        ev("response.output_item.added", output_index=2,
           item={"type": "web_search_call", "id": "ws", "status": "in_progress"}))
    assert n == 0
    n, _, _ = stream(
        ev("response.output_item.added", output_index=0,
           item={"type": "function_call", "name": "f", "arguments": "", "call_id": "c"}),
        ev("response.output_item.added", output_index=1,
           item={"type": "custom_tool_call", "name": "g", "input": "", "call_id": "d"}),
        ev("response.custom_tool_call_input.delta", delta="ls"))
    assert n == 3


@pytest.mark.parametrize(("obj", "want", "error", "kind"), [
    # a plain error body (HTTP 4xx/5xx), and vLLM's bare one
    ({"error": {"message": "No such model", "type": "invalid_request_error",
                "code": "model_not_found", "param": "model"}},
     (0, 0), "No such model", "invalid_request_error/model_not_found"),
    ({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400},
     (0, 0), "bad", "BadRequestError/400"),
    # a failed Response: its error; a completed one has "error": null
    ({"object": "response", "status": "failed", "output": [],
      "error": {"code": "server_error", "message": "boom"}}, (0, 0), "boom", "server_error"),
    ({"object": "response", "status": "completed", "error": None,
      "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "No."}]}],
      "usage": {"input_tokens": 3, "output_tokens": 2}}, (1, 2), None, None),
    # an empty message is no output
    ({"object": "response", "status": "completed", "error": None,
      "output": [{"type": "message", "content": [{"type": "output_text", "text": ""}]}],
      "usage": {"input_tokens": 3, "output_tokens": 1}}, (0, 0), None, None),
])
def test_whole_bodies(obj: dict[str, Any], want: tuple[int, int], error: str | None,
                      kind: str | None) -> None:
    got, p = body(obj)
    assert got == want and p.error == error and p.error_kind == kind
