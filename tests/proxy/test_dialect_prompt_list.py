"""A list of prompts on ``/v1/completions`` (``"prompt": ["a", "b"]``): the prompt tokens of
every prompt, each once.

What llama.cpp answers (real captures in ``tests/fixtures/llamacpp``, see its README): one
choice per prompt and per ``n``, choice ``i`` answering prompt ``i // n``; each choice's
finish event carries its own ``usage`` — its own prompt's ``prompt_tokens`` — and nothing
sums them. The parser took the last prompt figure (right for ``n > 1`` of one prompt, where
every choice repeats the same prompt), so the record said one prompt's tokens: 3 or 6,
whichever prompt finished last, for 9. The request body tells a list of prompts from
``n > 1``: the proxy now sums the last figure of each prompt. Not streamed, llama.cpp's usage
is the first prompt's first choice's alone: taken as it is (a lower bound; nothing made up).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_dialect_usage_n import all_splits
from test_proxy_support import Script, Seen, running_proxy, scripted_upstream

from llmtop.proxy.dialects.openai import OpenAIStreamParser, inspect_openai_request
from llmtop.proxy.dialects.registry import inspect_request

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
PROMPTS = ["The sky is", "One two three four five six"]  # 3 and 6 tokens
STREAM = (FIXTURES / "completions_stream_prompts2.sse").read_bytes()
STREAM_N2 = (FIXTURES / "completions_stream_prompts2_n2.sse").read_bytes()
ONE_PROMPT_N2 = (FIXTURES / "completions_stream_n2.sse").read_bytes()
BODY = (FIXTURES / "completions_prompts2.json").read_bytes()


def _finishes(raw: bytes) -> list[tuple[int, int, int]]:
    """(index, prompt_tokens, completion_tokens) of each finish event, in stream order."""
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: {"):
            obj = json.loads(block[6:])
            if "usage" in obj:
                u = obj["usage"]
                out.append((obj["choices"][0]["index"], u["prompt_tokens"],
                            u["completion_tokens"]))
    return out


def test_the_captures_are_what_the_fix_is_about() -> None:
    assert _finishes(STREAM) == [(1, 6, 4), (0, 3, 4)]  # the last one: prompt 0's 3
    assert _finishes(STREAM_N2) == [(1, 3, 3), (2, 6, 3), (0, 3, 3), (3, 6, 3)]
    assert STREAM.startswith(b"data: null\n\n") and b'"choices":[]' not in STREAM


@pytest.mark.parametrize(("prompt", "n", "want"), [
    ("a", None, (1, 1)),
    (PROMPTS, None, (2, 1)),
    (PROMPTS, 2, (2, 2)),
    (["a", "b", "c"], 3, (3, 3)),
    ([[504, 6376, 314], [2705, 827]], None, (2, 1)),  # token lists, one per prompt
    ([504, 6376, 314], 2, (1, 2)),  # one prompt as token ids
    (["a", 504, "b"], None, (1, 1)),  # llama.cpp's mixed prompt: one
    (["a"], None, (1, 1)),
    ([], None, (1, 1)),
    (PROMPTS, 0, (2, 1)),
    (PROMPTS, "2", (2, 1)),
    (PROMPTS, True, (2, 1)),
])
def test_the_request_says_how_many_prompts(prompt: Any, n: Any, want: tuple[int, int]) -> None:
    body: dict[str, Any] = {"model": "m", "prompt": prompt, "stream": True}
    if n is not None:
        body["n"] = n
    info = inspect_openai_request(json.dumps(body).encode())
    assert (info.prompts, info.n) == want
    info = inspect_request("openai", "/v1/completions", json.dumps(body).encode())
    assert (info.prompts, info.n) == want


def _parse(raw: list[bytes], prompts: int, n: int) -> OpenAIStreamParser:
    p = OpenAIStreamParser()
    p.several_prompts(prompts, n)
    for piece in raw:
        p.feed(piece)
    p.finish()
    return p


@pytest.mark.parametrize(("raw", "n", "completion"), [(STREAM, 1, 8), (STREAM_N2, 2, 12)],
                         ids=["n1", "n2"])
def test_each_prompt_counted_once_at_every_split(raw: bytes, n: int, completion: int) -> None:
    for pieces in all_splits(raw, n)[::3]:
        p = _parse(pieces, 2, n)
        assert p.usage_prompt_tokens == 3 + 6, [len(x) for x in pieces]
        assert p.usage_completion_tokens == completion  # every choice's, as before
        assert p.done and p.error is None


def test_one_prompt_with_n2_is_still_counted_once() -> None:
    """``n: 2`` of one prompt: both choices repeat the same prompt's figure — not doubled."""
    (first, second) = _finishes(ONE_PROMPT_N2)
    assert first[1] == second[1]
    p = _parse([ONE_PROMPT_N2], 1, 2)
    assert p.usage_prompt_tokens == first[1]


def test_a_usage_only_event_for_the_whole_request_is_taken_as_it_is() -> None:
    """vLLM: per-choice continuous usage, then one usage-only event that already sums the
    prompts: its figure, not summed again."""
    base = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}

    def ev(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**base, **obj}).encode() + b"\n\n"

    raw = b"".join([
        ev({"choices": [{"index": 0, "text": "a"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
        ev({"choices": [{"index": 1, "text": "b"}],
            "usage": {"prompt_tokens": 6, "completion_tokens": 1}}),
        ev({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}),
        b"data: [DONE]\n\n",
    ])
    p = _parse([raw], 2, 1)
    assert p.usage_prompt_tokens == 9 and p.usage_completion_tokens == 2
    p = _parse([raw[:raw.index(b'data: {"id"', 10)]], 2, 1)  # the first event alone
    assert p.usage_prompt_tokens == 3


# -- through the proxy ----------------------------------------------------------------------


def _replay(seen: Seen) -> Script:
    """The capture that answers the request's own prompt and ``n``."""
    req = json.loads(seen.body)
    if not isinstance(req["prompt"], list):
        chunks = ONE_PROMPT_N2
    elif req.get("stream"):
        chunks = STREAM_N2 if req.get("n") == 2 else STREAM
    else:
        chunks = BODY
    ctype = "text/event-stream" if req.get("stream") else "application/json"
    return Script(chunks=[chunks], headers={"Content-Type": ctype, "Server": "llama.cpp"})


async def test_the_record_has_every_prompts_tokens() -> None:
    cases: list[tuple[dict[str, Any], int, int]] = [
        ({"prompt": PROMPTS, "stream": True}, 9, 8),
        ({"prompt": PROMPTS, "stream": True, "n": 2}, 9, 12),
        ({"prompt": "Q: What is the capital of France?\nA:", "stream": True, "n": 2}, 12, 18),
        # not streamed: llama.cpp's usage is the first prompt's first choice's (a lower
        # bound, as for n > 1): taken as it is, not doubled
        ({"prompt": PROMPTS}, 3, 4),
    ]
    async with scripted_upstream() as up:
        up.responder = _replay
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            for i, (body, _p, _c) in enumerate(cases):
                async with s.post(url + "/v1/completions",
                                  json={"model": "m", "max_tokens": 4, **body}) as r:
                    assert r.status == 200
                    await r.read()
                records = await recs.wait(i + 1)  # one at a time: the records' order
                assert records[-1].outcome == "ok"
            got = [(r.prompt_tokens, r.completion_tokens, r.token_source)
                   for r in await recs.wait(len(cases))]
    assert got == [(p, c, "usage") for _, p, c in cases]
