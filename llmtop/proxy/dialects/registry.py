"""Choosing a dialect per request, and building its parser.

``DIALECTS`` maps every name the ``dialect`` setting accepts to its implementation, in the
shape of uvicorn's ``HTTP_PROTOCOLS``; ``auto`` (None) means "choose per request by path"
(``detect_dialect``; for ``/`` and ``/generate``, with the request's body). The relay
calls, once per request::

    dialect = detect_dialect(request.method, request.path, request.content_type, cfg.dialect,
                             body)
    info = inspect_request(dialect, request.path, body)          # model, user, stream
    ...                                                          # upstream answers
    parser = make_parser(dialect, info.stream, resp.content_type, request.path)
    for each read:  n, tokens = parser.feed(data)
    at EOF:         n, tokens = parser.finish()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from llmtop.events import Dialect
from llmtop.proxy.dialects._common import BAD, MAX_MODEL_CHARS, as_text, loads, text_or_none
from llmtop.proxy.dialects.anthropic import (
    AnthropicBodyParser,
    AnthropicStreamParser,
    inspect_anthropic_request,
)
from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.ollama import (
    OllamaBodyParser,
    OllamaStreamParser,
    inspect_ollama_request,
)
from llmtop.proxy.dialects.openai import (
    OpenAIBodyParser,
    OpenAIStreamParser,
    inspect_openai_request,
)
from llmtop.proxy.dialects.openai_responses import (
    ResponsesBodyParser,
    ResponsesStreamParser,
    inspect_responses_request,
    is_responses_path,
)
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.sglang import (
    SGLangBodyParser,
    SGLangStreamParser,
    inspect_sglang_request,
    is_sglang_request,
)
from llmtop.proxy.dialects.tgi import (
    TGIBodyParser,
    TGIStreamParser,
    inspect_tgi_request,
    is_tgi_compat_request,
)

__all__ = ["BODY_DECIDES", "DIALECTS", "DialectImpl", "detect_dialect", "inspect_request",
           "make_parser"]


@dataclass(frozen=True, slots=True)
class DialectImpl:
    """One dialect: its parsers for streamed and whole bodies, and its request reader."""

    name: Dialect
    stream_parser: Callable[[], StreamParser]
    body_parser: Callable[[], StreamParser]
    inspect: Callable[[str, bytes], RequestInfo]
    """``(path, body) -> RequestInfo``; never raises."""


def _inspect_generic(path: str, body: bytes) -> RequestInfo:
    """For unknown APIs: read ``model``/``user``/``stream`` if the body is a JSON object."""
    head = body[:64].lstrip()
    if not head.startswith(b"{"):
        return RequestInfo()
    obj = loads(body)
    if obj is BAD or not isinstance(obj, dict):
        return RequestInfo()
    return RequestInfo(model=text_or_none(obj.get("model")), user=text_or_none(obj.get("user")),
                       stream=obj.get("stream") is True)


DIALECTS: Final[Mapping[str, DialectImpl | None]] = MappingProxyType({
    "auto": None,
    "openai": DialectImpl("openai", OpenAIStreamParser, OpenAIBodyParser,
                          lambda _path, body: inspect_openai_request(body)),
    "anthropic": DialectImpl("anthropic", AnthropicStreamParser, AnthropicBodyParser,
                             lambda _path, body: inspect_anthropic_request(body)),
    "ollama": DialectImpl("ollama", OllamaStreamParser, OllamaBodyParser,
                          lambda _path, body: inspect_ollama_request(body)),
    "tgi": DialectImpl("tgi", TGIStreamParser, TGIBodyParser, inspect_tgi_request),
    "sglang": DialectImpl("sglang", SGLangStreamParser, SGLangBodyParser,
                          inspect_sglang_request),
    "other": DialectImpl("other", PlainParser, PlainParser, _inspect_generic),
})
"""Every accepted ``dialect`` setting; ``auto`` (None) = ``detect_dialect`` by path."""

OPENAI_RESPONSES: Final = DialectImpl(
    "openai", ResponsesStreamParser, ResponsesBodyParser,
    lambda _path, body: inspect_responses_request(body))
"""The ``openai`` dialect on the Responses API's create route (``…/responses``, see
``openai_responses``): recorded as ``openai``, read with its own parsers."""


def _impl(dialect: Dialect, path: str) -> DialectImpl | None:
    """``dialect``'s implementation for a request to ``path``."""
    if dialect == "openai" and is_responses_path(path):
        return OPENAI_RESPONSES
    return DIALECTS.get(dialect)


# path suffix → dialect, checked in order (``/api/generate`` before TGI's ``/generate``)
_SUFFIXES: Final[tuple[tuple[str, Dialect], ...]] = (
    ("/chat/completions", "openai"),
    ("/completions", "openai"),
    ("/responses", "openai"),
    ("/v1/messages", "anthropic"),
    ("/api/generate", "ollama"),
    ("/api/chat", "ollama"),
    ("/generate_stream", "tgi"),
    ("/generate", "tgi"),
)

BODY_DECIDES: Final[frozenset[Dialect]] = frozenset({"other", "tgi"})
"""The answers of ``detect_dialect`` without a body that the body may change: ``other``
(TGI's ``POST /``, llama.cpp's ``/completion``) and ``tgi`` (SGLang's ``/generate``)."""

_SSE = "text/event-stream"
_NDJSON = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl",
                     "application/x-jsonlines", "application/jsonlines"})


def detect_dialect(
    method: str, path: str, content_type: str | None, configured: str = "auto",
    body: bytes | None = None,
) -> Dialect:
    """The dialect of a request.

    A configured dialect other than ``auto`` wins. Otherwise the path decides, with any
    prefix (``/openai/v1/chat/completions`` is openai): ``…/chat/completions``,
    ``…/completions`` and ``…/responses`` (the Responses API's create route; not its
    ``…/responses/input_tokens`` or ``…/responses/{id}…`` routes) → openai;
    ``…/v1/messages`` → anthropic; ``…/api/generate`` and ``…/api/chat`` → ollama;
    ``…/generate_stream`` and ``…/generate`` → tgi; anything else, and any method but
    POST, → other. ``content_type`` (the request's) is accepted for
    callers' convenience; the path is what decides.

    SGLang serves its native API at ``/generate`` too: given the request's ``body``, a
    ``…/generate`` request is sglang when the body is SGLang's
    (``sglang.is_sglang_request``: ``text``, ``input_ids``, ``input_embeds`` or
    ``sampling_params``, and no ``inputs``), else tgi as before.

    ``…/completion`` is llama.cpp's own completion API (``n_predict``; answers with a
    top-level ``content``, which the openai parsers read): openai when the ``body`` is a
    JSON object with a ``prompt``, else other.

    The path ``/`` alone (query and trailing slashes aside) says nothing: TGI serves
    generation there, and so do other servers their own APIs. With the request's ``body``
    it is tgi when the body is a TGI request (``tgi.is_tgi_compat_request``: ``inputs`` a
    string, with ``parameters`` or ``stream``); without the body, or with any other body,
    it is other. A caller that decides before the body is read gets other for ``/`` (and
    tgi for ``/generate``) and may ask again with the body: only an answer in
    ``BODY_DECIDES`` can change.

    Raises ``ValueError`` only for an unknown ``configured`` name (config validation
    rejects those first).
    """
    if configured != "auto":
        impl = DIALECTS.get(configured)
        if impl is None:
            raise ValueError(f"unknown dialect {configured!r}; one of {', '.join(DIALECTS)}")
        return impl.name
    if method.upper() != "POST":
        return "other"
    p = path.split("?", 1)[0].rstrip("/").lower()
    for suffix, dialect in _SUFFIXES:
        if p.endswith(suffix):
            if suffix == "/generate" and body and is_sglang_request(body):
                return "sglang"  # SGLang's /generate, not TGI's
            return dialect
    if not p and body and is_tgi_compat_request(body):
        return "tgi"  # TGI's POST / (CompatGenerateRequest)
    if p.endswith("/completion") and body and _is_llamacpp_completion(body):
        return "openai"  # llama.cpp's own POST /completion: the openai parsers read it
    return "other"


def _is_llamacpp_completion(body: bytes) -> bool:
    """``body`` is a request for llama.cpp's own ``/completion``: a JSON object with a
    ``prompt`` (a string, tokens, or a list of either). Never raises."""
    if b'"prompt"' not in body or not body[:64].lstrip().startswith(b"{"):
        return False
    obj = loads(body)
    return isinstance(obj, dict) and isinstance(obj.get("prompt"), str | list | dict)


def _media_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def make_parser(
    dialect: Dialect, stream: bool, response_content_type: str | None = None,
    path: str = "",
) -> StreamParser:
    """A fresh parser for one response body to a request for ``path``.

    ``path`` chooses among a dialect's APIs: an ``openai`` request to ``…/responses`` gets
    the Responses API's parsers (``openai_responses``), any other the chat/completions ones.

    The response's content type decides when it says: ``text/event-stream`` or NDJSON →
    the dialect's stream parser; ``application/json`` (or ``…+json``) → its whole-body
    parser (e.g. a streaming request answered with a JSON error or a non-streaming
    answer). Without a telling content type, ``stream`` (from ``inspect_request``) decides.
    ``other`` always gets the plain parser.
    """
    impl = _impl(dialect, path)
    if impl is None:
        return PlainParser()
    media = _media_type(response_content_type)
    if media == _SSE or media in _NDJSON:
        streaming = True
    elif media == "application/json" or media.endswith("+json"):
        streaming = False
    else:
        streaming = stream
    return impl.stream_parser() if streaming else impl.body_parser()


def inspect_request(dialect: Dialect, path: str, body: bytes) -> RequestInfo:
    """Model, user, stream and whether the client asked for usage (or the API always
    sends it: ``sends_usage``). Never raises; the
    model is valid text (see ``as_text``), at most ``MAX_MODEL_CHARS`` long."""
    impl = _impl(dialect, path)
    if impl is None:
        return RequestInfo()
    try:
        info = impl.inspect(path, body)
    except Exception:  # a request body must never break the relay
        return RequestInfo()
    if info.model is not None:
        model = as_text(info.model[:MAX_MODEL_CHARS])
        if model is not info.model:
            info = dataclasses.replace(info, model=model)
    return info
