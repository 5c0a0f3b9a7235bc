"""Hostile and random input for every parser (issue 12's fuzzing bullet).

Random bytes and random splits never raise out of feed/finish/filter/flush, never hang
(hypothesis deadlines are off on this shared machine; pytest's timeout bounds a run), give
the same result however the bytes were split, and keep internal buffers bounded.
Set LLMTOP_FUZZ_EXAMPLES for a longer run (examples per test; default 150).
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtop.proxy.dialects.anthropic import AnthropicBodyParser, AnthropicStreamParser
from llmtop.proxy.dialects.base import StreamParser
from llmtop.proxy.dialects.lines import LineSplitter
from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
from llmtop.proxy.dialects.openai import OpenAIBodyParser, OpenAIStreamParser
from llmtop.proxy.dialects.openai_responses import ResponsesBodyParser, ResponsesStreamParser
from llmtop.proxy.dialects.openai_usage import UsageChunkStripper
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.sglang import SGLangBodyParser, SGLangStreamParser
from llmtop.proxy.dialects.sse import SSEFramer
from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser

SMALL = 512  # a small limit so that random input reaches the overflow paths

FACTORIES: dict[str, Callable[[], Any]] = {
    "openai": lambda: OpenAIStreamParser(SMALL),
    "openai_body": lambda: OpenAIBodyParser(SMALL),
    "responses": lambda: ResponsesStreamParser(SMALL),
    "responses_body": lambda: ResponsesBodyParser(SMALL),
    "anthropic": lambda: AnthropicStreamParser(SMALL),
    "anthropic_body": lambda: AnthropicBodyParser(SMALL),
    "ollama": lambda: OllamaStreamParser(SMALL),
    "ollama_body": lambda: OllamaBodyParser(SMALL),
    "tgi": lambda: TGIStreamParser(SMALL),
    "tgi_body": lambda: TGIBodyParser(SMALL),
    "sglang": lambda: SGLangStreamParser(SMALL),
    "sglang_body": lambda: SGLangBodyParser(SMALL),
    "plain": PlainParser,
}

# pieces that steer random input into the interesting paths of every dialect
TOKENS = [
    b"data:", b"data: ", b"event: error\n", b"event: ping\n", b"\n", b"\r", b"\r\n", b"\n\n",
    b":", b": keep-alive\n\n", b"{", b"}", b"[", b"]", b",", b'"choices":', b'"choices":[]',
    b'"choices":[{', b'"usage":{"completion_tokens":3,"prompt_tokens":2}', b'"usage":null',
    b'"delta":{"content":"x"}', b'"delta":{"content":""}', b'"error":"e"',
    b'"error":{"message":"m"}', b"[DONE]", b'"model":"m"', b'"token":{"special":false}',
    b'"response":"x"', b'"done":true', b'"eval_count":5', b'"type":"content_block_delta"',
    b'"text":"t"', b'"type":"message_delta"', b'"output_tokens":7', b"\xff", b"\x00", b" ",
    b"x" * 300, b"\xef\xbb\xbf", b'{"choices":[{"delta":{"content":"x"}}],"model":"m"}',
    b'{"choices":[],"usage":{"completion_tokens":1}}', b'"details":{"generated_tokens":2}',
    b'"meta_info":{"completion_tokens":3,"prompt_tokens":2}', b'"index":1',
    b'{"text":"a","meta_info":{"completion_tokens":2,"finish_reason":null}}',
    b'"finish_reason":{"type":"abort","message":"m","status_code":400}',
    b"event: response.output_text.delta\n", b'"type":"response.output_text.delta"',
    b'"delta":"d"', b'"type":"response.completed"', b'"response":{"usage":{"output_tokens":4}}',
    b'{"type":"response.failed","response":{"error":{"code":"c","message":"m"}}}',
]
sse_ish = st.lists(st.sampled_from(TOKENS), max_size=120).map(b"".join)
any_bytes = st.one_of(st.binary(max_size=3000), sse_ish)
cuts = st.lists(st.integers(min_value=0, max_value=4000), max_size=25)


def split(data: bytes, at: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in at})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def outcome(p: StreamParser, pieces: list[bytes]) -> tuple[Any, ...]:
    n = t = 0
    for piece in pieces:
        a, b = p.feed(piece)
        assert a >= 0 and b >= 0
        n, t = n + a, t + b
        assert getattr(p, "buffered_bytes", 0) <= SMALL * 2
    a, b = p.finish()
    assert a >= 0 and b >= 0
    return (n + a, t + b, p.usage_prompt_tokens, p.usage_completion_tokens, p.usage_seen,
            p.model, p.error is None)


# LLMTOP_FUZZ_EXAMPLES=5000 for a long run; the default keeps `make test` quick
EXAMPLES = int(os.environ.get("LLMTOP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@FUZZ
@given(data=any_bytes, at=cuts)
def test_random_bytes_never_raise_and_splits_do_not_matter(
    kind: str, data: bytes, at: list[int]
) -> None:
    whole = outcome(FACTORIES[kind](), [data])
    pieces = outcome(FACTORIES[kind](), split(data, at))
    assert pieces == whole
    if kind != "plain":  # the plain parser only notices that there were bytes
        ones = outcome(FACTORIES[kind](), [data[i : i + 1] for i in range(len(data))])
        assert ones == whole


@FUZZ
@given(data=any_bytes, at=cuts)
def test_framers_never_raise_and_stay_bounded(data: bytes, at: list[int]) -> None:
    f = SSEFramer(SMALL)
    events = [e for piece in split(data, at) for e in f.feed(piece)]
    assert f.buffered_bytes <= SMALL * 2
    events += f.finish()
    g = SSEFramer(SMALL)
    assert g.feed(data) + g.finish() == events
    for cr in (True, False):
        s = LineSplitter(SMALL, cr_is_eol=cr)
        lines = [ln for piece in split(data, at) for ln in s.feed(piece)]
        assert s.buffered_bytes <= SMALL
        last = s.finish()
        assert all(len(ln) <= SMALL for ln in lines)
        s2 = LineSplitter(SMALL, cr_is_eol=cr)
        assert [*s2.feed(data), *([x] if (x := s2.finish()) is not None else [])] == [
            *lines, *([last] if last is not None else [])]


@FUZZ
@given(data=any_bytes, at=cuts)
def test_stripper_on_random_bytes(data: bytes, at: list[int]) -> None:
    def run(pieces: list[bytes]) -> tuple[bytes, bool]:
        s = UsageChunkStripper(SMALL)
        out = []
        for piece in pieces:
            out.append(s.filter(piece))
            assert s.buffered_bytes <= SMALL
        out.append(s.flush())
        return b"".join(out), s.stripped

    whole, stripped = run([data])
    assert run(split(data, at)) == (whole, stripped)
    assert run([data[i : i + 1] for i in range(len(data))]) == (whole, stripped)
    if stripped:
        assert len(whole) < len(data)
    else:
        assert whole == data


# -- well-formed streams with random framing --------------------------------------------

_content = st.text(max_size=6)
_delta = st.one_of(
    st.fixed_dictionaries({"content": _content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.just("")}),
    st.fixed_dictionaries({"reasoning_content": _content}),
    st.fixed_dictionaries({"tool_calls": st.just([{"index": 0, "function": {
        "arguments": "{}"}}])}),
    st.just({}),
)
_event = st.fixed_dictionaries({"model": st.just("m"),
                                "choices": st.lists(st.fixed_dictionaries({"delta": _delta}),
                                                    min_size=1, max_size=1)})
_eol = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def framed_stream(draw: st.DrawFn) -> tuple[bytes, bytes, int]:
    """(stream, the usage event's bytes, content events) with random line ends,
    keep-alives and multi-line data."""
    objs: list[dict[str, Any]] = draw(st.lists(_event, max_size=8))
    usage_at = draw(st.integers(min_value=0, max_value=len(objs)))
    usage = {"model": "m", "choices": [], "usage": {"prompt_tokens": 4,
                                                    "completion_tokens": 9}}
    objs.insert(usage_at, usage)
    out: list[str] = []
    usage_bytes = ""
    prev = "\n"

    def term() -> str:
        nonlocal prev
        e = draw(_eol)
        if prev == "\r" and e == "\n":  # would merge into one "\r\n" line end
            e = "\r\n"
        prev = e
        return e

    for obj in objs:
        lines: list[str] = []
        if draw(st.booleans()):
            lines.append(": keep-alive")
        if draw(st.booleans()):
            lines += ["data: " + ln for ln in json.dumps(obj, indent=1).split("\n")]
        else:
            lines.append("data: " + json.dumps(obj))
        text = "".join(ln + term() for ln in lines) + term()
        if obj is usage:
            usage_bytes = text
        out.append(text)
    n = sum(1 for o in objs if o["choices"] and any(
        v for k, v in o["choices"][0]["delta"].items() if k != "role"))
    return "".join(out).encode(), usage_bytes.encode(), n


@settings(max_examples=EXAMPLES, deadline=None)
@given(stream=framed_stream(), seed=st.integers(0, 2**32 - 1))
def test_generated_streams_parse_and_strip_the_same_at_any_split(
    stream: tuple[bytes, bytes, int], seed: int
) -> None:
    raw, usage_event, n_content = stream
    rng = random.Random(seed)
    at = sorted(rng.sample(range(len(raw) + 1), k=min(len(raw) + 1, rng.randint(1, 30))))
    for pieces in ([raw], split(raw, at), [raw[i : i + 1] for i in range(len(raw))]):
        p = OpenAIStreamParser()
        for piece in pieces:
            p.feed(piece)
        p.finish()
        assert p.usage_completion_tokens == 9 and p.error is None
        s = UsageChunkStripper()
        out = b"".join(s.filter(piece) for piece in pieces) + s.flush()
        assert out == raw.replace(usage_event, b"", 1)
    whole = OpenAIStreamParser()
    assert whole.feed(raw)[0] + whole.finish()[0] == n_content


# -- 50 MB without a newline ------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_fifty_megabytes_without_newline_stay_bounded(kind: str) -> None:
    """The default limits (16 MiB a line/event, 32 MiB a body) hold whatever arrives."""
    factory = {
        "openai": OpenAIStreamParser, "openai_body": OpenAIBodyParser,
        "anthropic": AnthropicStreamParser, "anthropic_body": AnthropicBodyParser,
        "ollama": OllamaStreamParser, "ollama_body": OllamaBodyParser,
        "tgi": TGIStreamParser, "tgi_body": TGIBodyParser, "plain": PlainParser,
        "sglang": SGLangStreamParser, "sglang_body": SGLangBodyParser,
        "responses": ResponsesStreamParser, "responses_body": ResponsesBodyParser,
    }[kind]
    p = factory()
    block = b"data: " + b"A" * (1 << 20)  # 1 MiB reads, 50 of them
    peak = 0
    for _ in range(50):
        p.feed(block)
        peak = max(peak, getattr(p, "buffered_bytes", 0))
    assert peak <= 32 * 1024 * 1024
    p.finish()
    assert getattr(p, "buffered_bytes", 0) == 0
    if kind in ("openai", "anthropic", "ollama", "tgi", "sglang", "responses"):
        assert p.error is not None and "discarded" in p.error
        assert p.feed(b"\n\n") == (0, 0)  # recovers: the next events parse


def test_stripper_fifty_megabytes_without_newline_stay_bounded() -> None:
    s = UsageChunkStripper()
    block = b"A" * (1 << 20)
    total = 0
    for _ in range(50):
        total += len(s.filter(block))
        assert s.buffered_bytes <= 16 * 1024 * 1024
    total += len(s.flush())
    assert total == 50 * len(block), "nothing is lost: the giant event is released as is"
