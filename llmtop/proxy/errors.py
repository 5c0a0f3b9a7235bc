"""Errors the proxy itself answers with, in the API's own error shape.

A client library should be able to parse what the proxy says when the upstream cannot
be reached (502), is too slow (504) or the body is too big (413), exactly as if the
engine had said it:

- OpenAI (and ``other``, and ``sglang``, whose own ``/generate`` errors are
  ``{"error": {"message"}}``): ``{"error": {"message", "type", "param", "code"}}``
- Anthropic: ``{"type": "error", "error": {"type", "message"}}``
- Ollama: ``{"error": "..."}``
- TGI: ``{"error": "...", "error_type": "..."}``
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from llmtop.events import Dialect

_ANTHROPIC_TYPES: Final = {
    408: "timeout_error",
    413: "request_too_large",
    502: "api_error",
    504: "timeout_error",
}


def error_payload(dialect: Dialect, status: int, message: str, code: str) -> dict[str, Any]:
    """The JSON object for one proxy-made error; ``code`` is a short machine word such as
    ``upstream_timeout``, ``upstream_unreachable`` or ``request_too_large``."""
    full = f"llmtop: {message}"
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": full}}
    if dialect == "ollama":
        return {"error": full}
    if dialect == "tgi":
        return {"error": full, "error_type": code}
    kind = "invalid_request_error" if status < 500 else "proxy_error"
    return {"error": {"message": full, "type": kind, "param": None, "code": code}}


def error_response(dialect: Dialect, status: int, message: str, code: str) -> web.Response:
    """A complete JSON error response (``Content-Type: application/json``)."""
    body = json.dumps(error_payload(dialect, status, message, code)).encode()
    return web.Response(status=status, body=body, content_type="application/json")
