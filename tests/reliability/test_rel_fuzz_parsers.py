"""The stream parsers under hypothesis: every dialect, stream and whole-body parser, the
SSE framer, the line splitter and the usage-chunk stripper, fed random bytes and
SSE/NDJSON-shaped fragments at random splits.

tests/proxy/test_dialect_*.py already split the golden fixtures at every boundary and
check the SSE framer's garbage bound; this adds, for *all* parsers:

* ``feed``/``finish`` never raise, whatever the bytes;
* the result does not depend on where the reads were split (content events, tokens,
  usage, model, whether an error was seen; the stripper's output bytes);
* memory stays bounded: ``buffered_bytes`` never exceeds the configured maximum;
* no quadratic work: a long line fed one byte at a time finishes promptly.

(benchmarks/fuzz_parsers.py runs the same checks under atheris, coverage-guided.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtop.proxy.dialects.anthropic import AnthropicBodyParser, AnthropicStreamParser
from llmtop.proxy.dialects.lines import LineSplitter
from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
from llmtop.proxy.dialects.openai import (
    OpenAIBodyParser,
    OpenAIStreamParser,
    UsageChunkStripper,
)
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.sglang import SGLangBodyParser, SGLangStreamParser
from llmtop.proxy.dialects.sse import SSEFramer
from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser

MAX = 512
"""A small bound so that overflowing it is common in generated inputs."""
SSE_HELD = 2 * MAX
"""What an SSE parser may hold: the unfinished line and the open event's data are each
bounded by the maximum (sse.py), so together up to twice it (found by atheris)."""

PARSERS: dict[str, Callable[[], Any]] = {
    "openai-stream": lambda: OpenAIStreamParser(MAX),
    "openai-body": lambda: OpenAIBodyParser(MAX),
    "anthropic-stream": lambda: AnthropicStreamParser(MAX),
    "anthropic-body": lambda: AnthropicBodyParser(MAX),
    "ollama-stream": lambda: OllamaStreamParser(MAX),
    "ollama-body": lambda: OllamaBodyParser(MAX),
    "tgi-stream": lambda: TGIStreamParser(MAX),
    "tgi-body": lambda: TGIBodyParser(MAX),
    "sglang-stream": lambda: SGLangStreamParser(MAX),
    "sglang-body": lambda: SGLangBodyParser(MAX),
    "plain": PlainParser,
}

FRAGMENTS = [
    b"data: ", b"data:", b"event: ", b"event: content_block_delta\n", b"event: error\n",
    b": keep-alive\n", b"id: 7\n", b"retry: 10\n", b"\n", b"\r\n", b"\r", b"\n\n", b"\xef\xbb\xbf",
    b"[DONE]", b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\\u00e9", b"\\ud800", b"\xff",
    b'{"choices":[{"index":0,"delta":{"content":"hi"}}],"model":"m"}',
    b'{"choices":[{"delta":{"role":"assistant","content":""}}]}',
    b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}',
    b'{"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":3}}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}',
    b'{"error":{"message":"boom","type":"server_error"}}', b'{"object":"error","message":"x"}',
    b'{"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"}}',
    b'{"type":"message_delta","usage":{"output_tokens":9}}',
    b'{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":4}}}',
    b'{"model":"llama","message":{"role":"assistant","content":"hi"},"done":false}',
    b'{"model":"llama","done":true,"eval_count":4,"prompt_eval_count":2}',
    b'{"token":{"id":1,"text":"hi","special":false},"generated_text":null}',
    b'{"token":{"id":2,"text":"","special":true},"generated_text":"hi",'
    b'"details":{"generated_tokens":2}}',
    b'{"text":"hi","output_ids":[1],"meta_info":{"prompt_tokens":3,"completion_tokens":1}}',
    b'{"text":"hi","meta_info":{"completion_tokens":4,"finish_reason":{"type":"length"}},'
    b'"index":1}',
    b'"content"', b'"usage"', b'"choices"', b"null", b"true", b"1e999", b"-1", b"9" * 30,
    b"A" * 700,
]

fragments = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=64)),
                     max_size=60).map(b"".join)
payloads = st.one_of(st.binary(max_size=4096), fragments)


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in [*points, len(data)]:
        out.append(data[last:p])
        last = p
    return [c for c in out if c]


def held_max(p: Any) -> int:
    sse = isinstance(p, OpenAIStreamParser | AnthropicStreamParser | TGIStreamParser
                     | SGLangStreamParser | SSEFramer)
    return SSE_HELD if sse else MAX


def run_parser(make: Callable[[], Any], reads: list[bytes]) -> tuple[Any, ...]:
    """Feed ``reads``; check the bound after each; return what must not depend on splits."""
    p = make()
    bound = held_max(p)
    events = tokens = 0
    for r in reads:
        n, t = p.feed(r)
        assert n >= 0 and t >= 0
        events += n
        tokens += t
        assert p.buffered_bytes <= bound, (p.buffered_bytes, type(p).__name__)
    n, t = p.finish()
    assert n >= 0 and t >= 0
    events += n
    tokens += t
    assert p.buffered_bytes <= bound
    for attr in ("model", "error"):
        v = getattr(p, attr)
        assert v is None or (isinstance(v, str) and v), (attr, v)
        if isinstance(v, str):
            v.encode("utf-8")  # valid text: it ends up in records, JSON and the TUI
    return (events, tokens, p.usage_completion_tokens, p.usage_prompt_tokens,
            p.usage_seen, p.model, p.error is None)


FUZZ = settings(max_examples=75, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(data=payloads, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_parsers_never_raise_stay_bounded_and_ignore_splits(
        name: str, data: bytes, cuts: list[int]) -> None:
    make = PARSERS[name]
    whole = run_parser(make, [data] if data else [])
    split = run_parser(make, splits(data, cuts))
    assert split == whole, (name, data[:200], cuts)


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(lines=st.lists(fragments, max_size=20), eol=st.sampled_from([b"\n", b"\r\n", b"\n\n"]),
       cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_line_shaped_streams(name: str, lines: list[bytes], eol: bytes,
                             cuts: list[int]) -> None:
    data = eol.join(lines)
    assert run_parser(PARSERS[name], splits(data, cuts)) == run_parser(PARSERS[name], [data])


@FUZZ
@given(data=payloads, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_sse_framer_and_line_splitter_ignore_splits_and_stay_bounded(
        data: bytes, cuts: list[int]) -> None:
    for make in (lambda: SSEFramer(MAX), lambda: LineSplitter(MAX),
                 lambda: LineSplitter(MAX, cr_is_eol=False)):
        results = []
        for reads in ([data], splits(data, cuts)):
            f = make()
            got = []
            for r in reads:
                got.extend(f.feed(r))
                assert f.buffered_bytes <= held_max(f)
            tail = f.finish()  # SSEFramer: a list of events; LineSplitter: a line or None
            got.extend(tail if isinstance(tail, list) else [] if tail is None else [tail])
            results.append((got, f.error is None))
        assert results[0] == results[1], (data[:200], cuts)


@FUZZ
@given(data=payloads, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_usage_stripper_never_raises_ignores_splits_and_only_removes_usage(
        data: bytes, cuts: list[int]) -> None:
    outs = []
    for reads in ([data], splits(data, cuts)):
        s = UsageChunkStripper(MAX)
        out = b""
        for r in reads:
            out += s.filter(r)
            assert s.buffered_bytes <= MAX
        out += s.flush()
        outs.append(out)
    assert outs[0] == outs[1]
    if b'"usage"' not in data:
        assert outs[0] == data  # nothing else is ever removed
    else:
        assert len(outs[0]) <= len(data)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_long_lines_one_byte_at_a_time_are_linear(name: str) -> None:
    """64 KiB without a line end, one byte per read (the worst split), then a valid
    stream: finishes quickly, stays bounded, and the parser recovers."""
    p = PARSERS[name]()
    junk = b"data: " + b"x" * 65536
    t = time.perf_counter()
    for i in range(len(junk)):
        p.feed(junk[i:i + 1])
    p.feed(b"\n\n")
    took = time.perf_counter() - t
    assert p.buffered_bytes <= held_max(p)
    assert took < 20.0, f"{name}: {took:.1f} s for 64 KiB one byte at a time"
    p.finish()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_megabytes_of_garbage_in_big_reads_stay_bounded(name: str) -> None:
    import random

    rng = random.Random(7)
    p = PARSERS[name]()
    for _ in range(16):  # 4 MiB in 256 KiB reads: random bytes, no structure
        p.feed(rng.randbytes(256 * 1024))
        assert p.buffered_bytes <= held_max(p)
    p.finish()


def test_atheris_fuzzer_bounded_run(tmp_path: object) -> None:
    """benchmarks/fuzz_parsers.py: a bounded coverage-guided run finds nothing (atheris is
    optional: without it the script says how to install it and exits 2)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_parsers.py"
    r = subprocess.run([sys.executable, str(script), "--runs", "15000"], capture_output=True,
                       text=True, timeout=110, cwd=str(tmp_path))
    if importlib.util.find_spec("atheris") is None:
        assert r.returncode == 2 and "pip install atheris" in r.stderr, r
        return
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "fuzz_parsers: 15000 iterations done" in r.stdout, r.stdout[-2000:]
    assert "no failures" in r.stdout and "FAILED" not in r.stdout
    print([line for line in r.stdout.splitlines() if line.startswith("fuzz_parsers:")][-1])


def test_sse_line_and_open_event_together_stay_within_twice_the_maximum() -> None:
    """The input atheris found: an open event (an empty ``data`` line) plus an unfinished
    line at the maximum. Each part is bounded by the maximum, the sum by twice it."""
    p = OpenAIStreamParser(17)
    for r in (b"\x05\x00", b"lo\xff\xff\x02\x04\x00\x00\r\rdata\rdon\xa0one", b'":fone":fa',
              b'sE}\n{"dC\x00\x00\x00\x00\x00\x00count?:2}\n\xbd\xbd\xbd'):
        p.feed(r)
        assert p.buffered_bytes <= 2 * 17
    p.finish()
