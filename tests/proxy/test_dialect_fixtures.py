"""Golden byte fixtures for every dialect, fed whole, split at every byte boundary (all
two-way splits), one byte at a time, and at random boundaries: the results never change.

Each expectation below was worked out by reading the fixture (see
tests/fixtures/dialects/README.md), not by running the parser.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmtop.events import Dialect
from llmtop.proxy.dialects import StreamParser, make_parser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"


@dataclass(frozen=True)
class Expect:
    """What a whole body yields: totals, the tokens of each content event in order, and the
    parser's attributes at the end."""

    dialect: Dialect
    stream: bool
    content_type: str
    chunks: tuple[int, ...]
    prompt: int | None
    completion: int | None
    model: str | None
    error: str | None = None
    path: str = ""
    """The request's path (an ``openai`` request to ``…/responses`` is the Responses API)."""
    rid: str | None = None
    """The engine's id of the answer (``response_id``): the top-level ``id`` of an
    OpenAI-style body or first chunk, Anthropic's ``message.id``, the Responses API's
    ``response.id`` — not a tool call's or an output item's id —, SGLang's first
    ``meta_info.id``."""


SSE, NDJSON, JSON = "text/event-stream", "application/x-ndjson", "application/json"
SMOL = "smollm2-135m-instruct"
RESP, RM = "/v1/responses", "gpt-5-mini-2025-08-07"

CASES: dict[str, Expect] = {
    # real llama.cpp: 11 non-empty content deltas; the role chunk (content null) and the
    # finish chunk (empty delta) are not content; no usage without include_usage, but the
    # finish chunk's timings: predicted_n 12, prompt_n 1 + cache_n 35
    "llamacpp_chat_stream.sse": Expect("openai", True, SSE, (1,) * 11, 36, 12, SMOL,
                                       rid="chatcmpl-lkX4cT5MNqv10n6TnPh7oIV0TlnYDejE"),
    # same with include_usage: usage 36/12 (12 includes the end-of-sequence token)
    "llamacpp_chat_stream_usage.sse": Expect("openai", True, SSE, (1,) * 11, 36, 12, SMOL,
                                             rid="chatcmpl-t64ZSeq9XEuCR2ZqQzAxrakq9eSy2ExJ"),
    # 16 non-empty texts; usage rides on the finish chunk (text "")
    "llamacpp_completions_stream.sse": Expect("openai", True, SSE, (1,) * 16, 3, 16, SMOL,
                                              rid="chatcmpl-0RFSM9g2gWdWpKVczWpSLHTUbTACrcPc"),
    # text + 3 tool-call deltas; role-only "" and finish are not content; usage 50/19
    "openai_crlf_keepalive_tools.sse": Expect("openai", True, SSE, (1, 1, 1, 1), 50, 19,
                                              "gpt-4o-mini",
                                              rid="chatcmpl-A1"),
    # continuous usage cumulative 0,1,3,6,7,8(finish),8(usage-only) → 1,2,3,1 per event
    "openai_continuous_usage_reasoning.sse": Expect("openai", True, SSE, (1, 2, 3, 1), 20, 8,
                                                    "Qwen/Qwen3-8B",
                                                    rid="chatcmpl-A1"),
    # Hi / (multi-line) there / (no blank line at EOF) you
    "openai_multiline_no_final_blank.sse": Expect("openai", True, SSE, (1, 1, 1), None, None,
                                                  "llama-3",
                                                  rid="chatcmpl-A1"),
    # " once", " upon", "" (not content), " a time"; usage 4/5 in the finish chunk
    "openai_completions_cr.sse": Expect("openai", True, SSE, (1, 1, 1), 4, 5, "tinyllama",
                                        rid="cmpl-9"),
    "openai_error_midstream.sse": Expect("openai", True, SSE, (1, 1), None, None, "m",
                                         "CUDA out of memory. Tried to allocate 2 GiB",
                                         rid="chatcmpl-A1"),
    # thinking ×2, (signature: no), text ×2, tool_use start (its name), input_json ("" no) ×2;
    # prompt 472 + 100 cached
    "anthropic_stream.sse": Expect("anthropic", True, SSE, (1,) * 7, 572, 89,
                                   "claude-sonnet-4-5",
                                   rid="msg_01"),
    "anthropic_error_crlf.sse": Expect("anthropic", True, SSE, (1, 1), 12, None,
                                       "claude-sonnet-4-5", "Overloaded",
                                       rid="msg_01"),
    # The, sky, (empty), is, blue; done line has 26/5; last line without newline
    "ollama_generate.ndjson": Expect("ollama", True, NDJSON, (1,) * 4, 26, 5, "llama3.2"),
    # (empty), thinking, tool_calls, "Ok"; done 31/4
    "ollama_chat.ndjson": Expect("ollama", True, NDJSON, (1, 1, 1), 31, 4, "qwen3"),
    "ollama_error.ndjson": Expect(
        "ollama", True, NDJSON, (1, 1), None, None, "llama3.2",
        "model runner has unexpectedly stopped, this may be due to resource limitations"),
    # three tokens, then a special EOS token with details 4 generated / 7 input
    "tgi_generate_stream.sse": Expect("tgi", True, SSE, (1, 1, 1), 7, 4, None),
    "tgi_error.sse": Expect("tgi", True, SSE, (1, 1), None, None, None,
                            "Request failed during generation: Server error: CUDA out of memory"),
    # SGLang /generate: completion_tokens 1, 2, 5, 6, then 6 again with the finish_reason
    # (no new token: not content); prompt 7; no model named
    # (the id: every event's meta_info.id, SGLang's rid)
    "sglang_generate_stream.sse": Expect("sglang", True, SSE, (1, 1, 3, 1), 7, 6, None,
                                         rid="5e1f"),
    # incremental text: counts 1, 3, 4 (the last event has no line end, completed at EOF)
    "sglang_incremental_crlf.sse": Expect("sglang", True, SSE, (1, 2, 1), 7, 4, None,
                                          rid="5e1f"),
    # batch: index 0 counts 1, 2, 3 (prompt 5) and index 1 counts 1, 3 (prompt 6),
    # interleaved 0, 1, 0, 1, 0; the id: the first event's (index 0, b_0), not b_1
    "sglang_batch_stream.sse": Expect("sglang", True, SSE, (1, 1, 1, 2, 1), 11, 6, None,
                                      rid="b_0"),
    "sglang_error_midstream.sse": Expect("sglang", True, SSE, (1, 1), 7, 2, None,
                                         "The server is not ready to handle requests.",
                                         rid="5e1f"),
    # real llama.cpp Responses API: 22 non-empty output_text deltas (the message's
    # output_item.added and content_part.added are not content); response.completed's
    # usage 37/23 (23 includes the end-of-sequence token, in no delta)
    "llamacpp_responses_stream.sse": Expect("openai", True, SSE, (1,) * 22, 37, 23, SMOL,
                                            path=RESP,
                                            rid="resp_Knw59tXMqwUjq4Ktz2riQygLVixFn9rf"),
    # summary deltas ×2, (reasoning_text "": no), text ×2 ("" between: no), the function
    # call's output_item.added (its name), arguments ×2 ("": no); usage 50 (20 cached, in
    # input_tokens) / 40
    "openai_responses_stream.sse": Expect("openai", True, SSE, (1,) * 7, 50, 40, RM,
                                          path=RESP,
                                          rid="resp_1"),
    # refusal ×2, then response.failed (no blank line after it) with its error and usage
    "openai_responses_failed_crlf.sse": Expect(
        "openai", True, SSE, (1, 1), 50, 3, RM, "The model failed to generate a response.",
        path=RESP,
        rid="resp_1"),
    # data-only events: two deltas, then an error event (flat code/message)
    "openai_responses_error_midstream.sse": Expect(
        "openai", True, SSE, (1, 1), None, None, RM, "Rate limit reached for requests",
        path=RESP,
        rid="resp_1"),
    # whole bodies: one content event at finish() carrying the usage's completion tokens
    "llamacpp_responses.json": Expect("openai", False, JSON, (23,), 37, 23, SMOL, path=RESP,
                                      rid="resp_ok7cA3UOVzheQbqmnOqaSGXQdQbR3aQK"),
    # a reasoning summary and a function call; usage 50/33
    "openai_responses.json": Expect("openai", False, JSON, (33,), 50, 33, RM, path=RESP,
                                    rid="resp_1"),
    "llamacpp_chat_nonstream.json": Expect("openai", False, JSON, (12,), 36, 12, SMOL,
                                           rid="chatcmpl-eAzUsiJOOYCg6Tje4RgVsVRF8Gw2qyzB"),
    "anthropic_message.json": Expect("anthropic", False, JSON, (9,), 10, 9, "claude-haiku-4-5",
                                     rid="msg_02"),
    "ollama_chat.json": Expect("ollama", False, JSON, (3,), 26, 3, "llama3.2"),
    "tgi_generate.json": Expect("tgi", False, JSON, (3,), None, 3, None),
    "sglang_generate.json": Expect("sglang", False, JSON, (6,), 7, 6, None, rid="5e1f"),
    # a batch answer: a list of two outputs, 3 + 4 tokens, prompts 5 + 6
    "sglang_batch.json": Expect("sglang", False, JSON, (7,), 11, 7, None, rid="b_0"),
}


@dataclass(frozen=True)
class Result:
    events: int
    tokens: int
    prompt: int | None
    completion: int | None
    usage_seen: bool
    model: str | None
    error: str | None
    rid: str | None


def run(exp: Expect, pieces: list[bytes]) -> tuple[Result, list[tuple[int, int]]]:
    parser: StreamParser = make_parser(exp.dialect, exp.stream, exp.content_type, exp.path)
    per_read = [parser.feed(p) for p in pieces]
    per_read.append(parser.finish())
    events = sum(n for n, _ in per_read)
    tokens = sum(t for _, t in per_read)
    res = Result(events, tokens, parser.usage_prompt_tokens, parser.usage_completion_tokens,
                 parser.usage_seen, parser.model, parser.error, parser.response_id)
    return res, per_read


def expected_result(exp: Expect) -> Result:
    return Result(len(exp.chunks), sum(exp.chunks), exp.prompt, exp.completion,
                  exp.completion is not None, exp.model, exp.error, exp.rid)


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_every_fixture_has_a_case() -> None:
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".sse", ".ndjson", ".json")}
    assert on_disk == set(CASES)


# sha256 of the captures in shared/fixtures/llamacpp/ (as recorded there on 2026-11-30)
LLAMACPP_SHA256 = {
    "llamacpp_chat_stream.sse":
        "3ef25a43a68a0bab35b2b0fd61b8cb49af5e0e339667f05d6d53265bdd9e1269",
    "llamacpp_chat_stream_usage.sse":
        "69d328515811b2620fef6938f02ad382d0601d830ceed47150fe1987d3cae708",
    "llamacpp_completions_stream.sse":
        "3efcf892aa9aedc3e2f0023a9e0e3a23ebc203eab8e382813cda9e462dc64958",
    "llamacpp_chat_nonstream.json":
        "ae97644efdc6b988c6f90d5191012ca2b9a3ae1f20409c76ae6ac8097e9b1c47",
    # captured here on 2026-12-06 (see this folder's README)
    "llamacpp_responses_stream.sse":
        "841458f7e7c83a7bf05f6a546da7d5be0bdef5ba052e54647e97ac6acd07a221",
    "llamacpp_responses.json":
        "7538ca690a615488cb1f662c3cbc148823b3add039fb617601079a724d49c282",
}


def test_llamacpp_fixtures_are_the_real_captures_byte_for_byte() -> None:
    got = {n: hashlib.sha256(load(n)).hexdigest() for n in CASES if n.startswith("llamacpp_")}
    assert got == LLAMACPP_SHA256


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_feed(name: str) -> None:
    exp = CASES[name]
    res, _ = run(exp, [load(name)])
    assert res == expected_result(exp)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_byte_at_a_time_gives_each_event_on_the_read_that_ends_it(name: str) -> None:
    exp = CASES[name]
    raw = load(name)
    res, per_read = run(exp, [raw[i : i + 1] for i in range(len(raw))])
    assert res == expected_result(exp)
    assert all(n <= 1 for n, _ in per_read), "one byte completes at most one event"
    assert tuple(t for n, t in per_read if n) == exp.chunks


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_two_way_split(name: str) -> None:
    exp = CASES[name]
    raw = load(name)
    want = expected_result(exp)
    bad = [i for i in range(len(raw) + 1) if run(exp, [raw[:i], raw[i:]])[0] != want]
    assert not bad, f"splits at {bad[:10]} differ"


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_splits(name: str) -> None:
    exp = CASES[name]
    raw = load(name)
    want = expected_result(exp)
    rng = random.Random(name)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(raw)), k=rng.randint(1, min(40, len(raw) - 1))))
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        res, per_read = run(exp, pieces)
        assert res == want, cuts
        # the per-read tokens of a stream always add up to the same per-event tokens
        assert sum(t for _, t in per_read) == sum(exp.chunks)


@pytest.mark.parametrize("name", sorted(n for n, e in CASES.items() if e.stream))
def test_stream_reports_content_as_it_completes(name: str) -> None:
    """feed() reports each content event on the read that completes it; finish() only
    completes a last event that had no final blank line/newline."""
    exp = CASES[name]
    raw = load(name)
    parser = make_parser(exp.dialect, exp.stream, exp.content_type, exp.path)
    fed = parser.feed(raw)
    usage_before_eof = parser.usage_seen
    at_eof = parser.finish()
    if name in ("openai_multiline_no_final_blank.sse",  # last event has no blank line
                "sglang_incremental_crlf.sse"):
        assert at_eof == (1, 1)
    else:
        assert at_eof == (0, 0)
    assert (fed[0] + at_eof[0], fed[1] + at_eof[1]) == (len(exp.chunks), sum(exp.chunks))
    # ollama_generate's last line (the one with the counts) has no newline, nor has
    # openai_responses_failed_crlf's last event (response.failed, with the usage) its blank
    # line
    unended = ("ollama_generate.ndjson", "openai_responses_failed_crlf.sse")
    assert usage_before_eof == (exp.completion is not None and name not in unended)


@pytest.mark.parametrize("name", sorted(n for n, e in CASES.items() if not e.stream))
def test_whole_body_is_read_at_finish(name: str) -> None:
    exp = CASES[name]
    parser = make_parser(exp.dialect, exp.stream, exp.content_type, exp.path)
    assert parser.feed(load(name)) == (0, 0)
    assert parser.finish() == (1, exp.chunks[0])
    assert parser.finish() == (0, 0), "finish() twice does not count twice"
