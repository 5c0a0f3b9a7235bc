"""Anthropic Messages API (``/v1/messages``): SSE ``event:`` + ``data:`` pairs, and JSON.

Stream events (the type is the data's ``type``, else the ``event:`` name):

* ``content_block_delta`` with a non-empty ``text`` (text_delta), ``partial_json``
  (input_json_delta) or ``thinking`` (thinking_delta) is content, one token each
  (Anthropic gives no per-delta counts); signature and citation deltas are not;
* a ``tool_use``/``server_tool_use`` block's ``content_block_start`` is content: it is
  the tool call's first output, naming the tool (as OpenAI's first ``tool_calls`` delta,
  which carries the name and empty arguments and is content there too), so a tool call
  starts TTFT when its name arrives, not at its first non-empty ``partial_json`` — and a
  tool without arguments (only ``partial_json: ""`` follows) is content as well;
* a ``redacted_thinking`` block (its whole encrypted ``data`` comes in
  ``content_block_start``, with no deltas) is reasoning output: its start is content;
* ``message_start`` names the model, the answer's id (``message.id``, ``msg_…``) and the
  prompt size: ``usage.input_tokens`` plus
  ``cache_creation_input_tokens`` and ``cache_read_input_tokens`` when present (Anthropic
  counts cached prompt tokens apart from ``input_tokens``);
* ``message_delta`` carries the cumulative ``usage.output_tokens`` (the completion count),
  and may resend the prompt counts (each optional): they are merged key by key;
* ``error`` (e.g. ``overloaded_error`` mid-stream) sets ``error``; ``ping`` is skipped.
"""

from __future__ import annotations

from typing import Any

from llmtop.proxy.dialects._common import (
    BAD,
    MAX_EVENT_BYTES,
    JSONBodyParser,
    count,
    error_kind_of,
    error_text,
    loads,
    text_or_none,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.sse import SSEEvent, SSEStreamParser

__all__ = ["AnthropicBodyParser", "AnthropicStreamParser", "inspect_anthropic_request"]


def _prompt_tokens(usage: dict[str, Any]) -> int | None:
    base = count(usage.get("input_tokens"))
    if base is None:
        return None
    for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        extra = count(usage.get(key))
        if extra is not None:
            base += extra
    return base


def _error_of(obj: dict[str, Any]) -> tuple[str, str | None]:
    """Text and kind of ``{"type": "error", "error": {"type": "overloaded_error",
    "message": "Overloaded"}}`` (kind ``overloaded_error``)."""
    err = obj.get("error")
    return error_text(err if err is not None else obj), error_kind_of(obj)


_PROMPT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})


class AnthropicStreamParser(SSEStreamParser):
    """An Anthropic Messages SSE stream."""

    __slots__ = ("_prompt_parts",)

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self._prompt_parts: dict[str, int] = {}
        """The prompt's counts read so far, by usage key (``_PROMPT_KEYS``)."""

    def _merge_prompt(self, usage: dict[str, Any]) -> None:
        """Merge a usage object's prompt counts key by key, as Anthropic's SDK does: in
        ``message_delta`` each of them is optional (null or absent when not resent), so a
        ``message_delta`` with ``input_tokens`` and a null ``cache_read_input_tokens`` keeps
        the cached tokens ``message_start`` gave."""
        parts = self._prompt_parts
        for key in _PROMPT_KEYS:
            v = count(usage.get(key))
            if v is not None:
                parts[key] = v
        if "input_tokens" in parts:
            self.usage_prompt_tokens = sum(parts.values())

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        n = 0
        for ev in events:
            if ev.event == "ping":
                continue
            obj = loads(ev.data)
            if not isinstance(obj, dict):
                if ev.event == "error":
                    self._fail(error_text(ev.data.decode("utf-8", "replace")))
                elif obj is BAD:
                    self._fail("malformed JSON in stream event")
                continue
            typ = obj.get("type")
            if not isinstance(typ, str):
                typ = ev.event
            if typ == "content_block_delta":
                d = obj.get("delta")
                if isinstance(d, dict) and (
                    d.get("text") or d.get("partial_json") or d.get("thinking")
                ):
                    n += 1
            elif typ == "content_block_start":
                block = obj.get("content_block")
                if isinstance(block, dict):
                    kind = block.get("type")
                    if isinstance(kind, str) and (
                        kind in _TOOL_BLOCKS  # the tool's name: its first output
                        or (kind == "redacted_thinking" and block.get("data"))
                    ):
                        n += 1
            elif typ == "message_start":
                msg = obj.get("message")
                if isinstance(msg, dict):
                    self._set_model(msg.get("model"))
                    self._set_response_id(msg.get("id"))
                    usage = msg.get("usage")
                    if isinstance(usage, dict):
                        self._merge_prompt(usage)
            elif typ == "message_delta":
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    self._set_completion(usage.get("output_tokens"))
                    self._merge_prompt(usage)
            elif typ == "message_stop":
                self.ended = True
            elif typ == "error" or ev.event == "error":
                self._fail(*_error_of(obj))
        return (n, n)


class AnthropicBodyParser(JSONBodyParser):
    """A non-streaming Messages response (``application/json``)."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        if obj.get("type") == "error" or "error" in obj:
            self._fail(*_error_of(obj))
            return False
        self._set_model(obj.get("model"))
        self._set_response_id(obj.get("id"))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._set_completion(usage.get("output_tokens"))
            prompt = _prompt_tokens(usage)
            if prompt is not None:
                self.usage_prompt_tokens = prompt
        blocks = obj.get("content")
        if not isinstance(blocks, list):
            return False
        for b in blocks:
            if isinstance(b, dict) and (
                b.get("text") or b.get("thinking") or b.get("type") in ("tool_use",
                                                                        "server_tool_use")
            ):
                return True
        return False


def inspect_anthropic_request(body: bytes) -> RequestInfo:
    """Model, stream and ``metadata.user_id`` (as the user) of a Messages request. Never
    raises."""
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict):
        return RequestInfo()
    model = obj.get("model")
    meta = obj.get("metadata")
    user = meta.get("user_id") if isinstance(meta, dict) else None
    return RequestInfo(
        model=text_or_none(model),
        user=text_or_none(user),
        stream=obj.get("stream") is True,
        wants_usage=False,
    )
