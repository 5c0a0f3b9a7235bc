"""Token counting for the simulator, and the synthetic text it streams.

Prompt-token rule (documented, deterministic, no tokenizer needed):

* text: ``ceil(characters / 4)`` tokens (the usual ~4 characters per English token);
* a chat conversation: the sum over messages of ``4 + ceil(chars(content) / 4)`` plus 3
  for the assistant reply priming (OpenAI's published rule of thumb for chat formats);
  content given as a list of parts counts its text parts;
* a prompt given as a list of token ids (as vLLM accepts) counts ``len(list)``;
* never less than 1.

Output text is built from a fixed vocabulary of word pieces; one piece is one token. No
prompt text is ever stored.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

VOCAB: tuple[str, ...] = (
    " the", " engine", " streams", " tokens", " while", " the", " batch", " grows",
    ",", " and", " every", " step", " reads", " the", " weights", " once", ".", " Memory",
    " bandwidth", " sets", " the", " pace", " of", " decode", ";", " prefill", " is",
    " compute", "-bound", ".", " Queues", " form", " when", " slots", " run", " out",
    ",", " so", " latency", " rises", " but", " throughput", " stays", " flat", ".",
    " A", " cache", " of", " keys", " and", " values", " fills", " up", " as",
    " sequences", " lengthen", "\n", " Watch", " the", " tail", ",", " not", " the",
    " mean", ".",
)
"""Output word pieces; token ``i`` of a request is ``VOCAB[(offset + i) % len(VOCAB)]``."""

VOCAB_JSON: tuple[bytes, ...] = tuple(json.dumps(w)[1:-1].encode() for w in VOCAB)
"""Each piece JSON-escaped, without quotes: ready to splice into a JSON string."""


def text_tokens(text: str) -> int:
    """Tokens in plain text: ceil(chars / 4)."""
    return math.ceil(len(text) / 4)


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, str):
                n += len(part)
            elif isinstance(part, dict):
                for key in ("text", "content"):
                    val = part.get(key)
                    if isinstance(val, str):
                        n += len(val)
                    elif isinstance(val, list):
                        n += _content_chars(val)
        return n
    return 0


def chat_tokens(messages: Any, system: Any = None) -> int:
    """Prompt tokens of a chat conversation (and an optional separate system prompt)."""
    total = 3
    if system is not None:
        total += 4 + math.ceil(_content_chars(system) / 4)
    if isinstance(messages, list):
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            total += 4 + math.ceil(_content_chars(content) / 4)
    return max(1, total)


def prompt_tokens(prompt: Any) -> int:
    """Prompt tokens of a completions-style prompt: text, a list of token ids, or a list
    holding one of those (only the first element is counted: ``/v1/completions`` refuses
    a batch of several)."""
    if isinstance(prompt, str):
        return max(1, text_tokens(prompt))
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return len(prompt)
        return prompt_tokens(first)
    return 1


def sample_output_len(rng: random.Random, dist: str, mean: int) -> int:
    """An output length drawn from the profile's distribution (≥ 1)."""
    if dist == "fixed":
        return max(1, mean)
    if dist == "exponential":
        return max(1, round(rng.expovariate(1.0 / mean)))
    return rng.randint(1, max(1, 2 * mean - 1))


def text_of(offset: int, start: int, count: int) -> str:
    """The text of ``count`` tokens starting at token index ``start``."""
    n = len(VOCAB)
    return "".join(VOCAB[(offset + i) % n] for i in range(start, start + count))


def json_text_of(offset: int, start: int, count: int) -> bytes:
    """:func:`text_of` JSON-escaped (no quotes), from the pre-encoded pieces."""
    n = len(VOCAB_JSON)
    if count == 1:
        return VOCAB_JSON[(offset + start) % n]
    return b"".join(VOCAB_JSON[(offset + i) % n] for i in range(start, start + count))
