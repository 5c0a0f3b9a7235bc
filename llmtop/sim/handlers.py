"""The generation endpoints: parse, submit to the engine, stream (or not) in each dialect.

A handler never polls: it sleeps on its request's event, writes every chunk the engine has
produced since (one write, each chunk its own event), records the write time, and sleeps
again. When the client goes away the aiohttp task is cancelled (the app runs with
``handler_cancellation=True``) or a write fails; either way the ``finally`` clause removes
the request from the engine at once, which records ``cancelled_at``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web

from llmtop.sim.bodies import (
    BadRequest,
    Parsed,
    parse_chat,
    parse_completion,
    parse_messages,
    parse_ollama_chat,
    parse_ollama_generate,
    parse_tgi,
    parse_tgi_compat,
    parse_tgi_stream,
)
from llmtop.sim.engine import FINISHED, EngineClosed, SimEngine, SimRequest, SimRequestError
from llmtop.sim.faults import HEADER, Faults, parse_faults
from llmtop.sim.formats import (
    AnthropicEncoder,
    ChatEncoder,
    CompletionEncoder,
    Encoder,
    OllamaChatEncoder,
    OllamaGenerateEncoder,
    TgiEncoder,
)
from llmtop.sim.responses_format import ResponsesEncoder, parse_responses

ENGINE: web.AppKey[SimEngine] = web.AppKey("sim_engine", SimEngine)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 529: "overloaded_error"}
"""Anthropic's ``error.type`` by status (``api_error`` otherwise)."""

_OPENAI_TYPES = {400: "BadRequestError", 401: "AuthenticationError",
                 403: "PermissionDeniedError", 404: "NotFoundError",
                 405: "MethodNotAllowedError", 409: "ConflictError",
                 413: "RequestEntityTooLargeError", 422: "UnprocessableEntityError",
                 429: "RateLimitError"}
"""vLLM's ``error.type`` by status (openai-python's exception class names where it has
one); another 4xx gets its reason phrase in the same style."""


def _openai_type(status: int) -> str:
    if status in _OPENAI_TYPES:
        return _OPENAI_TYPES[status]
    if status >= 500:
        return "InternalServerError"
    try:  # 415 UnsupportedMediaTypeError, …
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "BadRequestError"
    return "".join(w[:1].upper() + w[1:] for w in re.split(r"[^A-Za-z]+", phrase)) + "Error"


def _openai_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": _openai_type(status), "param": None,
                      "code": status}}


def _anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error",
            "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


def _plain_error(status: int, message: str) -> dict[str, Any]:
    return {"error": message}


def _tgi_error(status: int, message: str) -> dict[str, Any]:
    return {"error": message, "error_type": "validation" if status == 400 else "generation"}


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one endpoint reads requests, writes responses and reports errors."""

    name: str
    id_prefix: str
    parse: Callable[[dict[str, Any]], Parsed]
    encoder: type[Encoder]
    error: Callable[[int, str], dict[str, Any]]


CHAT = Dialect("openai", "chatcmpl-", parse_chat, ChatEncoder, _openai_error)
COMPLETIONS = Dialect("openai", "cmpl-", parse_completion, CompletionEncoder, _openai_error)
MESSAGES = Dialect("anthropic", "msg_", parse_messages, AnthropicEncoder, _anthropic_error)
OLLAMA_CHAT = Dialect("ollama", "ollama-", parse_ollama_chat, OllamaChatEncoder, _plain_error)
OLLAMA_GENERATE = Dialect("ollama", "ollama-", parse_ollama_generate, OllamaGenerateEncoder,
                          _plain_error)
TGI_STREAM = Dialect("tgi", "tgi-", parse_tgi_stream, TgiEncoder, _tgi_error)
TGI = Dialect("tgi", "tgi-", parse_tgi, TgiEncoder, _tgi_error)
TGI_COMPAT = Dialect("tgi", "tgi-", parse_tgi_compat, TgiEncoder, _tgi_error)
RESPONSES = Dialect("openai", "resp_", parse_responses, ResponsesEncoder, _openai_error)


def error_response(dialect: Dialect, status: int, message: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error in ``dialect``'s shape (``429`` adds ``Retry-After: 1``)."""
    headers = dict(headers or {})
    if status == 429:
        headers.setdefault("Retry-After", "1")
    return web.json_response(dialect.error(status, message), status=status,
                             headers=headers or None)


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _wait(req: SimRequest) -> None:
    req.event.clear()
    await req.event.wait()


async def _stream(request: web.Request, req: SimRequest, enc: Encoder,
                  faults: Faults) -> web.StreamResponse:
    resp = web.StreamResponse(headers={
        "Content-Type": enc.content_type + "; charset=utf-8"
        if enc.content_type.startswith("text/") else enc.content_type,
        "Cache-Control": "no-cache",
        "X-Sim-Request-Id": req.id,
    })
    await resp.prepare(request)
    try:
        head = enc.head()
        if head:
            await resp.write(head)
        await _pump(request, resp, req, enc, faults)
    except ConnectionError:  # the client went away mid-write; aiohttp copes with the rest
        pass
    return resp


async def _pump(request: web.Request, resp: web.StreamResponse, req: SimRequest,
                enc: Encoder, faults: Faults) -> None:
    checked = faults.any_mid_stream
    out = req.out
    sent = chunks = 0
    first = True
    if checked and faults.hits(0) and await _fault(request, resp, enc, faults, 0):
        return
    while True:
        if not out:
            if req.done:
                break
            await _wait(req)
            continue
        if first:
            # like vLLM: the role chunk / message_start goes out with the first token, in
            # its own write just before it
            first = False
            opening = enc.first()
            if opening:
                await resp.write(opening)
        parts = []
        before = chunks
        while out:
            k = out.popleft()
            parts.append(enc.chunk(sent, k))
            sent += k
            chunks += 1
            if checked and faults.hits(chunks):
                break
        t = time.time()
        await resp.write(b"".join(parts))
        req.chunks.extend([t] * (chunks - before))
        if checked and faults.hits(chunks) and await _fault(request, resp, enc, faults, chunks):
            return
    if req.state != FINISHED:  # the server is shutting down: drop the connection
        _abort(request)
        return
    await resp.write(enc.end())
    await resp.write_eof()


async def _fault(request: web.Request, resp: web.StreamResponse, enc: Encoder,
                 faults: Faults, chunks: int) -> bool:
    """Act on the faults due after ``chunks`` content chunks; True when the stream is over."""
    if chunks == faults.malformed_after:
        await resp.write(enc.malformed())
    if faults.stall_s is not None and chunks == faults.stall_after:
        await asyncio.sleep(faults.stall_s)
    if chunks == faults.disconnect_after:
        _abort(request)
        return True
    return False


async def _whole(request: web.Request, req: SimRequest, enc: Encoder,
                 faults: Faults, listed: bool = False) -> web.StreamResponse:
    while not req.done:
        req.out.clear()
        if faults.disconnect_after is not None and req.generated >= faults.disconnect_after:
            _abort(request)
            return web.Response()
        await _wait(req)
    req.out.clear()
    if req.state != FINISHED:
        _abort(request)
        return web.Response()
    if faults.stall_s is not None:
        await asyncio.sleep(faults.stall_s)
    if faults.disconnect_after is not None and req.generated >= faults.disconnect_after:
        # N tokens were generated (with the last step); a shorter answer never got there
        _abort(request)
        return web.Response()
    body = json.dumps([enc.body()] if listed else enc.body()).encode()
    if faults.malformed_after is not None:
        body = body[: len(body) // 2]
    return web.Response(body=body, content_type="application/json",
                        headers={"X-Sim-Request-Id": req.id})


async def serve(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """Handle one generation request of ``dialect`` end to end."""
    engine = request.app[ENGINE]
    try:
        faults = parse_faults(request.headers.get(HEADER))
    except ValueError as exc:
        return error_response(dialect, 400, str(exc))
    try:
        body = json.loads(await request.read())
    except RecursionError:  # the C decoder recurses once per nesting level
        return error_response(dialect, 400, "the request body is nested too deeply")
    except ValueError:
        return error_response(dialect, 400, "the request body is not valid JSON")
    if not isinstance(body, dict):
        return error_response(dialect, 400, "the request body must be a JSON object")
    try:
        parsed = dialect.parse(body)
    except BadRequest as exc:
        return error_response(dialect, 400, str(exc))
    if faults.status is not None:
        if faults.slow_headers_s:
            await asyncio.sleep(faults.slow_headers_s)
        return error_response(dialect, faults.status,
                              f"simulated error {faults.status} ({HEADER})")
    try:
        req = engine.submit(path=request.path, stream=parsed.stream,
                            prompt_tokens=parsed.prompt_tokens, max_tokens=parsed.max_tokens,
                            id_prefix=dialect.id_prefix)
    except SimRequestError as exc:
        return error_response(dialect, 400, str(exc))
    except EngineClosed as exc:
        return error_response(dialect, 503, str(exc))
    enc = dialect.encoder(req, parsed.model or engine.profile.model,
                          include_usage=parsed.include_usage,
                          continuous_usage=parsed.continuous_usage, details=parsed.details,
                          prefill=parsed.prefill)
    try:
        if faults.slow_headers_s:
            await asyncio.sleep(faults.slow_headers_s)
        if parsed.stream:
            return await _stream(request, req, enc, faults)
        return await _whole(request, req, enc, faults, listed=parsed.listed)
    finally:
        # client gone (task cancelled, write failed) or a fault dropped the connection
        engine.cancel(req)


def endpoint(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler for ``dialect``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await serve(request, dialect)

    return handler
