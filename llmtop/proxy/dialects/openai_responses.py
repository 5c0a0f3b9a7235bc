"""The OpenAI Responses API (``POST …/v1/responses``): SSE ``event:`` + ``data:`` pairs, and JSON.

Served by OpenAI itself, vLLM, SGLang and llama.cpp's ``llama-server``; recorded with
dialect ``openai`` (the record's ``path`` tells the API apart from chat completions).
``registry`` picks these parsers for an ``openai`` request whose path ends in
``/responses`` (:func:`is_responses_path`); the API's other routes (``…/input_tokens``,
``GET``/``DELETE …/responses/{id}``, ``…/{id}/cancel``) are plain requests.

Each event is ``event: <type>`` then ``data: {"type": <type>, "sequence_number": n, …}``.
The type is the data's ``type``, else the ``event:`` name. An event whose ``event:`` name
is a ``response.*`` type llmtop does not read (``response.output_text.done`` and the other
``*.done`` events repeat the whole text) is skipped without decoding its JSON; every server
checked writes the name equal to the data's ``type``. Any other name (none, or a generic
``message``) leaves the decision to the data's ``type``.

* content: a non-empty ``delta`` in ``response.output_text.delta``,
  ``response.reasoning_text.delta``, ``response.reasoning_summary_text.delta``,
  ``response.refusal.delta``, ``response.function_call_arguments.delta`` and the other
  tool-call deltas the model writes (``response.custom_tool_call_input.delta``,
  ``response.mcp_call_arguments.delta``, ``response.code_interpreter_call_code.delta``);
  one token each (the API gives no per-delta counts; the relay scales to the usage);
* a ``response.output_item.added`` whose item is a ``function_call`` or
  ``custom_tool_call`` is content too: it names the tool, the call's first output — as
  chat completions' first ``tool_calls`` delta (name, empty arguments) and Anthropic's
  ``tool_use`` ``content_block_start`` are (see ``openai`` and ``anthropic``). So a tool
  call starts TTFT when its name arrives, whichever dialect the client speaks, and a call
  whose arguments come in one delta, or none, still shows as output. Other items' ``added``
  (a ``message`` with ``content: []``, a ``reasoning`` item, hosted tools the server runs)
  carry no output yet and are not;
* usage: ``response.usage`` of the terminal event — ``response.completed``,
  ``response.incomplete`` (e.g. ``max_output_tokens`` reached: a normal end, like
  ``finish_reason: length``) or ``response.failed`` — ``output_tokens`` (reasoning tokens
  included) and ``input_tokens``. Cached prompt tokens are *included* in ``input_tokens``
  (``input_tokens_details.cached_tokens`` is a breakdown of it), unlike Anthropic's
  ``cache_read_input_tokens``: vLLM sets ``input_tokens`` to the prompt's whole length and
  ``cached_tokens`` apart; llama.cpp writes ``n_prompt_tokens`` and, of them,
  ``n_prompt_tokens_cache`` (a repeated prompt answered ``input_tokens: 37,
  cached_tokens: 36``, the first time 37 and 0). The terminal event ends the stream
  (``ended``); the model comes from any event's ``response.model``, the answer's id
  (``resp_…``) from its ``response.id``;
* errors: an ``error`` event (``{"type": "error", "code", "message", "param"}`` flat, or
  an ``error`` object inside) and ``response.failed`` (its ``response.error``:
  ``{"code", "message"}``) set ``error`` and ``error_kind`` (the ``code``); a ``data:
  [DONE]`` some gateways append is skipped.

Not streamed: the ``Response`` object (``"object": "response"``), whose ``error`` is null
unless it failed, or an error body (``{"error": {…}}``, vLLM's ``{"object": "error", …}``).
It has output when an ``output`` item is a tool call or holds a part with non-empty
``text`` or ``refusal`` (messages' ``content``, reasoning items' ``content``/``summary``).

Requests: ``model``, ``stream`` and ``user`` (interfaces.md, "Who is the user": the body's
``user`` field; the API's newer ``safety_identifier`` and ``prompt_cache_key`` are not
read). The API always sends usage, so the proxy never asks for it (``sends_usage``).

Checked against: openai-python ``src/openai/types/responses/`` (``response_stream_event``,
``response_text_delta_event``, ``response_function_call_arguments_delta_event``,
``response_reasoning_summary_text_delta_event``, ``response_output_item_added_event``,
``response_error_event``, ``response_failed_event``, ``response_incomplete_event``,
``response_error``, ``response_usage``); vLLM ``vllm/entrypoints/openai/serving_responses.py``
(usage) and its ``_convert_stream_to_sse_events`` (``event: {type}\\ndata: {json}\\n\\n``);
llama.cpp ``tools/server/server-task.cpp`` ``to_json_oaicompat_resp[_stream]``; and real
captures of llama-server 0.3.36 (``tests/fixtures/dialects/llamacpp_responses*``, which
carry no ``sequence_number``).
"""

from __future__ import annotations

from typing import Any, Final

from llmtop.proxy.dialects._common import (
    BAD,
    MAX_EVENT_BYTES,
    JSONBodyParser,
    ParserState,
    error_kind,
    error_kind_of,
    error_text,
    loads,
    text_or_none,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.sse import SSEEvent, SSEStreamParser

__all__ = [
    "ResponsesBodyParser",
    "ResponsesStreamParser",
    "inspect_responses_request",
    "is_responses_path",
]

CONTENT_DELTAS: Final = frozenset({
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
    "response.mcp_call_arguments.delta",
    "response.code_interpreter_call_code.delta",
})
"""Event types whose non-empty ``delta`` is output the model wrote."""

TOOL_ITEMS: Final = frozenset({"function_call", "custom_tool_call"})
"""Output items that are a tool call the client runs: their ``added`` names the tool."""

_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_ITEM_ADDED: Final = "response.output_item.added"
_READ: Final = CONTENT_DELTAS | _TERMINAL | {
    _ITEM_ADDED, "error", "response.error", "response.created", "response.in_progress",
    "response.queued"}
"""Every event type the stream parser reads; an ``event:`` name outside it is skipped."""
_DONE: Final = b"[DONE]"


def is_responses_path(path: str) -> bool:
    """True for the Responses API's create route: a path (query and trailing slashes
    aside, any prefix) ending in ``/responses``. ``/v1/responses/input_tokens`` and
    ``/v1/responses/{id}[/cancel]`` are not."""
    return path.split("?", 1)[0].rstrip("/").lower().endswith("/responses")


def _error_of(obj: dict[str, Any]) -> tuple[str, str | None] | None:
    """The error text and kind of an error event or body (None: ``obj`` holds no error):
    an ``error`` object inside (``{"error": {"message", "type", "code"}}``, or a failed
    ``Response``'s ``{"code", "message"}``), or vLLM's bare ``{"object": "error", …}``."""
    err = obj.get("error")
    if err is not None:
        return error_text(err), error_kind_of(obj)
    if obj.get("object") == "error":
        return error_text(obj), error_kind(obj)
    return None


def _usage(state: ParserState, response: dict[str, Any]) -> None:
    usage = response.get("usage")
    if isinstance(usage, dict):
        state._set_completion(usage.get("output_tokens"))
        state._set_prompt(usage.get("input_tokens"))


class ResponsesStreamParser(SSEStreamParser):
    """A streamed Responses API answer (see the module docstring for what counts)."""

    __slots__ = ()

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        n = 0
        for ev in events:
            name = ev.event
            if name not in _READ and name.startswith("response."):
                continue  # a type not read, by its name: not decoded
            obj = loads(ev.data)
            if not isinstance(obj, dict):
                if ev.data == _DONE:
                    self.ended = True
                elif name == "error":
                    self._fail(error_text(ev.data.decode("utf-8", "replace")))
                elif obj is BAD:
                    self._fail("malformed JSON in stream event")
                continue
            typ = obj.get("type")
            if not isinstance(typ, str):
                typ = name
            if typ in CONTENT_DELTAS:
                delta = obj.get("delta")
                if isinstance(delta, str) and delta:
                    n += 1
            elif typ == _ITEM_ADDED:
                item = obj.get("item")
                if isinstance(item, dict) and item.get("type") in TOOL_ITEMS:
                    n += 1
            elif typ == "error" or typ == "response.error":
                err = _error_of(obj)  # else OpenAI's flat {"code", "message", "param"}
                self._fail(*(err if err is not None else (error_text(obj), error_kind(obj))))
            else:
                response = obj.get("response")
                if isinstance(response, dict):
                    self._set_model(response.get("model"))
                    if self._response_id is None:  # ``resp_…``, from response.created on
                        self._set_response_id(response.get("id"))
                    if typ in _TERMINAL:
                        self.ended = True
                        _usage(self, response)
                        if typ == "response.failed":
                            err = _error_of(response)
                            self._fail(*(err if err is not None else ("response failed", None)))
        return (n, n)


def _has_output(items: object) -> bool:
    if not isinstance(items, list):
        return False
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") in TOOL_ITEMS:
            return True
        for key in ("content", "summary"):
            parts = item.get(key)
            if isinstance(parts, list) and any(
                isinstance(p, dict) and (p.get("text") or p.get("refusal")) for p in parts
            ):
                return True
    return False


class ResponsesBodyParser(JSONBodyParser):
    """A non-streamed Responses API answer (``application/json``)."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        self._set_model(obj.get("model"))
        self._set_response_id(obj.get("id"))
        _usage(self, obj)
        err = _error_of(obj)
        if err is not None:
            self._fail(*err)
            return False
        return _has_output(obj.get("output"))


def inspect_responses_request(body: bytes) -> RequestInfo:
    """Model, user and stream of a Responses API request. Never raises."""
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict):
        return RequestInfo(sends_usage=True)
    model = obj.get("model")
    user = obj.get("user")
    return RequestInfo(
        model=text_or_none(model),
        user=text_or_none(user),
        stream=obj.get("stream") is True,
        sends_usage=True,
    )
