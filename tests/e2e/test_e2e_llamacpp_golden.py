"""Golden streamed responses captured from the real llama.cpp server (tests/fixtures/llamacpp/),
fed through llmtop's OpenAI dialect parser split at every byte boundary; and a check that
the server still answers the same way (so the golden files stay true)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_support import load_real_engine, sse_events

from llmtop.proxy.dialects.registry import detect_dialect, make_parser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
real_engine = load_real_engine()
GOLDEN = sorted(real_engine.GOLDEN_REQUESTS)


def _expected(body: bytes) -> tuple[int, int, int, int]:
    """(content events, completion tokens, prompt tokens, timings.predicted_n), read plainly."""
    content = 0
    usage: dict[str, Any] = {}
    predicted = -1
    for payload in sse_events(body):
        if payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        for choice in obj.get("choices") or ():
            if (choice.get("delta") or {}).get("content") or choice.get("text"):
                content += 1
        if obj.get("usage"):
            usage = obj["usage"]
            predicted = obj["timings"]["predicted_n"]
    return content, usage["completion_tokens"], usage["prompt_tokens"], predicted


def _parse(path: str, pieces: list[bytes]) -> tuple[int, int, Any]:
    parser = make_parser(detect_dialect("POST", path, "application/json"), True,
                         "text/event-stream")  # fmt: skip
    events = tokens = 0
    for piece in pieces:
        n, t = parser.feed(piece)
        events, tokens = events + n, tokens + t
    n, t = parser.finish()
    return events + n, tokens + t, parser


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_stream_parses_the_same_at_every_byte_boundary(name: str) -> None:
    """Content events and the usage the parser reads equal the server's own (its usage and
    ``timings.predicted_n``), whether the stream arrives whole, split in two at any byte, or
    one byte at a time. (An end-of-sequence token is in the usage but in no content event:
    the relay scales per-chunk counts to the usage.)"""
    body = (FIXTURES / name).read_bytes()
    path = real_engine.GOLDEN_REQUESTS[name][0]
    content, completion, prompt, predicted = _expected(body)
    assert content > 1 and completion == predicted
    splits = [[body]] + [[body[:i], body[i:]] for i in range(1, len(body))]
    splits.append([body[i : i + 1] for i in range(len(body))])
    for pieces in splits:
        events, tokens, parser = _parse(path, pieces)
        where = f"split at {len(pieces[0])}" if len(pieces) == 2 else f"{len(pieces)} pieces"
        assert events == content, where
        assert tokens == content, where  # one per event: llama.cpp sends no running usage
        assert parser.usage_completion_tokens == completion, where
        assert parser.usage_prompt_tokens == prompt, where
        assert parser.usage_seen and parser.error is None, where
        assert parser.model == real_engine.MODEL_ALIAS, where


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_files_are_what_the_server_sends_today(engine: Any, name: str) -> None:
    """The same request, replayed against the live server, gives the same event sequence
    (text, roles, finish reasons, token counts) — only ids, timestamps, timings and the
    prompt-cache figures differ."""
    path, body = real_engine.GOLDEN_REQUESTS[name]
    fresh = real_engine.fetch_raw(engine.url, path, body)

    def shape(raw: bytes) -> list[Any]:
        out: list[Any] = []
        for payload in sse_events(raw):
            if payload == b"[DONE]":
                out.append("[DONE]")
                continue
            obj = json.loads(payload)
            usage = obj.get("usage") or {}
            out.append((obj.get("object"), obj.get("model"), obj.get("choices"),
                        usage.get("completion_tokens"), usage.get("prompt_tokens")))  # fmt: skip
        return out

    assert shape(fresh) == shape((FIXTURES / name).read_bytes())
