"""Ollama's native API (``/api/generate``, ``/api/chat``): NDJSON streams and JSON.

One JSON object a line (``application/x-ndjson``). A line is content when it has a
non-empty ``response`` (generate) or ``message.content`` / ``message.thinking`` /
``message.tool_calls`` (chat), or a non-empty top-level ``thinking``; Ollama streams one
token a line, so each content line carries one token. The last line has ``done: true``
with ``eval_count`` (completion tokens) and ``prompt_eval_count``. ``{"error": ...}``
lines set ``error`` (Ollama's errors are text only: ``error_kind`` stays None unless
something in front of Ollama adds a ``type``/``code``). Unlike OpenAI, ``stream``
defaults to TRUE when a request omits it.
"""

from __future__ import annotations

from typing import Any

from llmtop.proxy.dialects._common import (
    BAD,
    MAX_EVENT_BYTES,
    ZERO,
    JSONBodyParser,
    ParserState,
    error_kind_of,
    error_text,
    loads,
    text_or_none,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.lines import LineSplitter

__all__ = ["OllamaBodyParser", "OllamaStreamParser", "inspect_ollama_request"]


def _read_object(state: ParserState, obj: dict[str, Any]) -> bool:
    """Usage, model and errors of one Ollama object; True if it carries output content."""
    err = obj.get("error")
    if err is not None:
        state._fail(error_text(err), error_kind_of(obj))
        return False
    state._set_model(obj.get("model"))
    if obj.get("done") is True:
        state.ended = True
        state._set_completion(obj.get("eval_count"))
        state._set_prompt(obj.get("prompt_eval_count"))
    if obj.get("response") or obj.get("thinking"):
        return True
    msg = obj.get("message")
    return isinstance(msg, dict) and bool(
        msg.get("content") or msg.get("thinking") or msg.get("tool_calls")
    )


class OllamaStreamParser(ParserState):
    """An Ollama NDJSON stream, split anywhere across reads."""

    __slots__ = ("_lines",)

    def __init__(self, max_line_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__()
        self._lines = LineSplitter(max_line_bytes, cr_is_eol=False)

    @property
    def buffered_bytes(self) -> int:
        return self._lines.buffered_bytes

    def feed(self, data: bytes) -> tuple[int, int]:
        lines = self._lines.feed(data)
        if self._lines.error is not None:
            self._fail(self._lines.error)
        return self._handle(lines) if lines else ZERO

    def finish(self) -> tuple[int, int]:
        last = self._lines.finish()
        return self._handle([last]) if last is not None else ZERO

    def _handle(self, lines: list[bytes]) -> tuple[int, int]:
        n = 0
        for line in lines:
            if not line or line.isspace():
                continue
            obj = loads(line)
            if obj is BAD:
                self._fail("malformed JSON line in stream")
            elif isinstance(obj, dict) and _read_object(self, obj):
                n += 1
        return (n, n)


class OllamaBodyParser(JSONBodyParser):
    """A non-streaming Ollama response: one JSON object."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        return isinstance(obj, dict) and _read_object(self, obj)


def inspect_ollama_request(body: bytes) -> RequestInfo:
    """Model and stream (TRUE unless the body says ``"stream": false``). Never raises; a
    body that is not a JSON object gives ``RequestInfo()``."""
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict):
        return RequestInfo()  # Ollama answers a body it cannot read with a JSON error
    model = obj.get("model")
    return RequestInfo(
        model=text_or_none(model),
        stream=obj.get("stream") is not False,
    )
