"""Hugging Face TGI's native API: ``/generate_stream`` SSE and ``/generate`` JSON.

Stream events are ``data: {"token": {"id", "text", "logprob", "special"},
"generated_text": null | str, "details": null | {...}}``: every event whose token is not
special is content carrying exactly one token; the last event's
``details.generated_tokens`` is the completion count (and ``details.input_length``, in
newer TGI, the prompt size). ``data: {"error": "...", "error_type": ...}`` sets ``error``
(and ``error_kind``, the ``error_type``: ``validation``, ``generation``, ``overloaded``,
``incomplete_generation``).
``/generate`` answers ``{"generated_text": ..., "details": {...}}`` (or a one-element
list of it, as the hosted Inference API and TGI's ``/`` do); its ``details`` has no
``input_length``, but with ``decoder_input_details`` a ``prefill`` list of the prompt's
tokens.
TGI's ``/`` route takes ``{"inputs": "...", "parameters": {...}, "stream": true|false}``
and answers as ``/generate_stream`` when ``stream`` is true, else as ``/generate``; a
request there is told from other APIs' ``/`` by its body (``is_tgi_compat_request``).
"""

from __future__ import annotations

from typing import Any

from llmtop.proxy.dialects._common import (
    BAD,
    JSONBodyParser,
    ParserState,
    error_kind_of,
    error_text,
    loads,
    text_or_none,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.sse import SSEEvent, SSEStreamParser

__all__ = ["TGIBodyParser", "TGIStreamParser", "inspect_tgi_request", "is_tgi_compat_request"]


def _read_details(state: ParserState, obj: dict[str, Any]) -> None:
    details = obj.get("details")
    if isinstance(details, dict):
        state._set_completion(details.get("generated_tokens"))
        prompt = details.get("input_length")  # a stream's StreamDetails
        if prompt is None and isinstance(prefill := details.get("prefill"), list) and prefill:
            prompt = len(prefill)  # /generate's Details: the prompt's tokens, when
            # decoder_input_details asked for them (an empty list otherwise)
        state._set_prompt(prompt)


class TGIStreamParser(SSEStreamParser):
    """A TGI ``/generate_stream`` SSE stream."""

    __slots__ = ()

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        n = 0
        for ev in events:
            obj = loads(ev.data)
            if not isinstance(obj, dict):
                if ev.event == "error":
                    self._fail(error_text(ev.data.decode("utf-8", "replace")))
                elif obj is BAD:
                    self._fail("malformed JSON in stream event")
                continue
            err = obj.get("error")
            if err is not None or ev.event == "error":
                self._fail(error_text(err if err is not None else obj), error_kind_of(obj))
                continue
            token = obj.get("token")
            if isinstance(token, dict) and token.get("special") is not True:
                n += 1
            _read_details(self, obj)
            if obj.get("generated_text") is not None or isinstance(obj.get("details"), dict):
                self.ended = True  # the last event of a stream
        return (n, n)


class TGIBodyParser(JSONBodyParser):
    """A TGI ``/generate`` response."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        if isinstance(obj, list) and obj:
            obj = obj[0]
        if not isinstance(obj, dict):
            return False
        err = obj.get("error")
        if err is not None:
            self._fail(error_text(err), error_kind_of(obj))
            return False
        _read_details(self, obj)
        return bool(obj.get("generated_text"))


def inspect_tgi_request(path: str, body: bytes) -> RequestInfo:
    """``/generate_stream`` is always a stream; otherwise the body's ``stream`` decides
    (TGI's ``/`` route). TGI requests name no model. Never raises."""
    streaming_path = path.split("?", 1)[0].rstrip("/").endswith("/generate_stream")
    obj = loads(body) if body else BAD
    stream = streaming_path or (isinstance(obj, dict) and obj.get("stream") is True)
    model = obj.get("model") if isinstance(obj, dict) else None
    return RequestInfo(model=text_or_none(model), stream=stream)


def is_tgi_compat_request(body: bytes) -> bool:
    """``body`` is a request for TGI's ``/`` route: a JSON object whose ``inputs`` is a
    string (TGI's ``CompatGenerateRequest``) with a ``parameters`` object or a boolean
    ``stream`` — what TGI's clients (``text_generation``, ``huggingface_hub``) send.

    Stricter than "has ``inputs``" because other servers take ``inputs`` at ``/`` too:
    text-embeddings-inference's default route (``{"inputs": "...", "normalize": true}``,
    no ``parameters`` or ``stream``), KServe/Triton tensors (``inputs`` a list). A bare
    ``{"inputs": "..."}`` stays unread (dialect ``other``). Never raises."""
    if b'"inputs"' not in body or not body[:64].lstrip().startswith(b"{"):
        return False
    obj = loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("inputs"), str):
        return False
    return isinstance(obj.get("parameters"), dict) or isinstance(obj.get("stream"), bool)
