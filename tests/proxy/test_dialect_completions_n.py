"""Legacy completions (``/v1/completions``) with ``n > 1``: the usage of every choice.

QA against the real llama.cpp server: its streamed completions carry ``usage`` (and
``timings``) on each choice's finish event — that choice's ``completion_tokens`` and the
whole prompt's ``prompt_tokens`` — whether or not the client asked for usage, and no
usage-only event. The parser read them as continuous usage (the last one wins), so an
``n: 2`` answer counted one choice. Now the last figure of each choice index is summed —
which is also right for vLLM's ``continuous_usage_stats``, cumulative per choice (it
counts ``previous_num_tokens[i]`` for choice ``i``), and for ``n = 1`` (the last wins).

``tests/fixtures/llamacpp/completions_stream_n2.sse`` and ``completions_n2.json`` are
real captures (see that folder's README); the parser is fed the stream whole, split in
two at every byte and one byte at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_dialect_usage_n import all_splits

from llmtop.proxy.dialects.openai import OpenAIBodyParser, OpenAIStreamParser
from llmtop.proxy.dialects.registry import detect_dialect, make_parser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
STREAM = "completions_stream_n2.sse"
BODY = "completions_n2.json"


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(block[6:]) for block in raw.split(b"\n\n") if block.startswith(b"data: {")]


def _parse(pieces: list[bytes]) -> tuple[int, int, OpenAIStreamParser]:
    p = make_parser(
        detect_dialect("POST", "/v1/completions", "application/json"), True, "text/event-stream"
    )
    assert isinstance(p, OpenAIStreamParser)
    events = tokens = 0
    for piece in [*pieces, None]:
        n, t = p.feed(piece) if piece is not None else p.finish()
        events, tokens = events + n, tokens + t
    return events, tokens, p


def test_the_real_capture_is_what_the_fix_is_about() -> None:
    """Two finish events, each with its own choice's usage (6 and 12 tokens), the same
    prompt in both, and no usage-only event."""
    events = _events((FIXTURES / STREAM).read_bytes())
    finishes = [e for e in events if e["choices"][0]["finish_reason"]]
    assert [
        (
            e["choices"][0]["index"],
            e["usage"]["completion_tokens"],
            e["usage"]["prompt_tokens"],
            e["timings"]["predicted_n"],
        )
        for e in finishes
    ] == [(1, 6, 12, 6), (0, 12, 12, 12)]
    assert all("usage" not in e for e in events if e not in finishes)
    assert all(e["choices"] for e in events)


def test_the_usage_of_both_choices_is_counted_at_every_byte_boundary() -> None:
    raw = (FIXTURES / STREAM).read_bytes()
    content = sum(1 for e in _events(raw) if e["choices"][0]["text"])
    assert content == 17  # 12 + 5: choice 1 ended on an end-of-sequence token (its 6th)
    splits = [[raw]] + [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    splits.append([raw[i : i + 1] for i in range(len(raw))])
    for pieces in splits:
        events, tokens, p = _parse(pieces)
        where = [len(x) for x in pieces[:2]]
        assert p.usage_completion_tokens == 6 + 12, where  # not the last choice's 12
        assert p.usage_prompt_tokens == 12, where  # the same prompt: once
        assert events == tokens == content, where
        assert p.usage_seen and p.done and p.error is None, where


def _chunk(
    i: int, text: str, usage: tuple[int, int] | None = None, finish: str | None = None
) -> bytes:
    obj: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def test_vllm_continuous_usage_per_choice_is_summed_and_each_event_its_increase() -> None:
    """vLLM's ``continuous_usage_stats`` with ``n: 2``: every event carries its choice's
    cumulative count (the second event of choice 0 packs 3 tokens); the events carry the
    increase, and the total is both choices' last figures (7 + 3), also at every split."""
    steps = [
        (0, "a", 1),
        (1, "b", 1),
        (0, "cde", 4),
        (1, "f", 2),
        (0, "g", 5),
        (1, "h", 3),
        (0, "ij", 7),
    ]
    chunks = [_chunk(i, t, (9, n)) for i, t, n in steps]
    raw = b"".join(
        [
            *chunks,
            _chunk(1, "", (9, 3), "stop"),
            _chunk(0, "", (9, 7), "length"),
            b"data: [DONE]\n\n",
        ]
    )
    p = OpenAIStreamParser()
    assert [p.feed(c) for c in chunks] == [(1, 1), (1, 1), (1, 3), (1, 1), (1, 1), (1, 1), (1, 2)]
    for pieces in all_splits(raw, 5)[::3]:
        events, tokens, q = _parse(pieces)
        assert (events, tokens) == (7, 10), [len(x) for x in pieces]
        assert q.usage_completion_tokens == 10 and q.usage_prompt_tokens == 9


def test_vllm_continuous_usage_then_its_usage_event_for_the_whole_answer() -> None:
    """With ``include_usage`` vLLM ends with one usage-only event for all choices: its
    figure stands."""
    raw = b"".join(
        [
            _chunk(0, "a", (9, 1)),
            _chunk(1, "b", (9, 1)),
            _chunk(0, "c", (9, 2)),
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":'
            b'"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,'
            b'"total_tokens":12}}\n\n',
            b"data: [DONE]\n\n",
        ]
    )
    events, tokens, p = _parse([raw])
    assert (events, tokens) == (3, 3)
    assert p.usage_completion_tokens == 3 and p.usage_prompt_tokens == 9


def test_one_choice_keeps_the_last_usage() -> None:
    """``n = 1`` continuous usage: cumulative, the last figure is the answer's."""
    raw = b"".join(
        [
            _chunk(0, "a", (4, 1)),
            _chunk(0, "bc", (4, 3)),
            _chunk(0, "d", (4, 4)),
            _chunk(0, "", (4, 5), "stop"),
            b"data: [DONE]\n\n",
        ]
    )
    events, tokens, p = _parse([raw])
    assert (events, tokens) == (3, 4)
    assert p.usage_completion_tokens == 5 and p.usage_prompt_tokens == 4


def test_usage_on_an_event_of_several_choices_is_the_whole_answers() -> None:
    """An event that is not one choice with an ``index`` carries a whole-answer figure:
    it replaces the figures before it (never added to them)."""
    two = (
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":'
        b'[{"index":0,"text":"a"},{"index":1,"text":"b"}],"usage":{"prompt_tokens":2,'
        b'"completion_tokens":%d,"total_tokens":0}}\n\n'
    )
    raw = b"".join(
        [_chunk(0, "a", (2, 1)), _chunk(1, "b", (2, 1)), two % 4, two % 6, b"data: [DONE]\n\n"]
    )
    _, _, p = _parse([raw])
    assert p.usage_completion_tokens == 6


def test_non_streamed_n2_takes_llamacpps_usage_as_it_is() -> None:
    """Not streamed, llama.cpp's ``usage`` and ``timings`` are choice 0's alone (here an
    empty answer: 1 token, the end of sequence) although choice 1 wrote a sentence, and it
    sends no per-choice counts: the figures are what the engine said — a lower bound —
    and no count is made up for the other choices (documented in the dialect)."""
    raw = (FIXTURES / BODY).read_bytes()
    obj = json.loads(raw)
    assert [c["text"] for c in obj["choices"]] == ["", ' The answer is "Paris"']
    assert obj["usage"]["completion_tokens"] == obj["timings"]["predicted_n"] == 1
    p = OpenAIBodyParser()
    for i in range(0, len(raw), 97):
        p.feed(raw[i : i + 97])
    assert p.finish() == (1, 1)
    assert p.usage_completion_tokens == 1 and p.usage_prompt_tokens == 12
