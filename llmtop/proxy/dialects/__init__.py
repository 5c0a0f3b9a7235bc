"""Stream dialects: what the relay learns from a copy of each upstream read.

Plain synchronous parsers (``feed(bytes) -> (content_events, tokens)``, ``finish()``) for
OpenAI-style SSE (chat/completions, and the Responses API's typed events), Anthropic SSE,
Ollama NDJSON, TGI SSE, SGLang's native SSE and anything else; a registry that picks one per
request; and the OpenAI usage-injection helpers. No I/O, no asyncio.
"""

from __future__ import annotations

from llmtop.proxy.dialects.base import RequestInfo, StreamParser
from llmtop.proxy.dialects.openai_usage import (
    UsageChunkStripper,
    add_include_usage,
    is_usage_rejection,
)
from llmtop.proxy.dialects.registry import (
    DIALECTS,
    DialectImpl,
    detect_dialect,
    inspect_request,
    make_parser,
)

__all__ = [
    "DIALECTS",
    "DialectImpl",
    "RequestInfo",
    "StreamParser",
    "UsageChunkStripper",
    "add_include_usage",
    "detect_dialect",
    "inspect_request",
    "is_usage_rejection",
    "make_parser",
]
