"""OpenAI-compatible endpoints of the simulator, driven by the openai SDK over real sockets."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from sim_support import chat_body, get_json, post_raw, sse_events

from llmtop.sim.server import running_sim
from llmtop.sim.tokens import VOCAB

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
FAST = {"time_scale": 0.3}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


async def test_chat_stream_with_usage_via_sdk() -> None:
    """Streamed chat: role chunk first, one content chunk per token, an empty finish chunk,
    then a usage-only chunk whose counts follow the documented prompt rule."""
    async with running_sim("tiny", **FAST) as sim, client(sim.url) as c:
        stream = await c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 40}], max_tokens=7,
            stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content is None
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 7
    finish = chunks[-2]
    assert finish.choices[0].finish_reason == "length"
    assert finish.choices[0].delta.content is None
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    # 3 (priming) + 4 (one message) + ceil(40 / 4)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (17, 7)
    assert last.usage.total_tokens == 24
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert all(piece in VOCAB for piece in (c.choices[0].delta.content for c in content))
    assert text.strip()
    assert len({c.id for c in chunks}) == 1


async def test_chat_stream_bytes_look_like_llamacpp() -> None:
    """The raw bytes have the shape of a real server's (llama.cpp fixture): every event
    ends with a blank line, the role chunk's delta is {role, content: null}, the finish
    chunk's delta is empty, usage comes last with choices: [], then ``data: [DONE]``."""
    real = sse_events((FIXTURES / "llamacpp_chat_stream_usage.sse").read_bytes())
    async with running_sim("tiny", **FAST) as sim:
        status, headers, raw = await post_raw(
            sim.url + "/v1/chat/completions",
            chat_body(5, stream_options={"include_usage": True}))
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert raw.endswith(b"data: [DONE]\n\n")
    ours = sse_events(raw)
    for events in (real, ours):
        assert events[-1][1] == "[DONE]"
        first, finish, usage = (json.loads(events[i][1]) for i in (0, -3, -2))
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert finish["choices"][0]["delta"] == {}
        assert finish["choices"][0]["finish_reason"] in ("stop", "length")
        assert usage["choices"] == []
        assert {"prompt_tokens", "completion_tokens", "total_tokens"} <= set(usage["usage"])
        assert first["object"] == "chat.completion.chunk"
    assert raw.count(b"\n\n") == len(ours)
    assert all(line.startswith(b"data: ") for line in raw.split(b"\n\n") if line)


async def test_chat_without_usage_has_no_usage_chunk() -> None:
    async with running_sim("tiny", **FAST) as sim:
        _, _, raw = await post_raw(sim.url + "/v1/chat/completions", chat_body(3))
    events = [json.loads(d) for _, d in sse_events(raw)[:-1]]
    assert all("usage" not in e for e in events)
    assert len(events) == 1 + 3 + 1


async def test_chat_not_streamed_via_sdk() -> None:
    async with running_sim("tiny", **FAST) as sim, client(sim.url) as c:
        resp = await c.chat.completions.create(
            model="m", messages=[{"role": "system", "content": "abcd"},
                                 {"role": "user", "content": "abcdefgh"}], max_tokens=6)
        records = sim.engine.records()
    assert resp.object == "chat.completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (3 + 5 + 6, 6)
    content = resp.choices[0].message.content or ""
    assert content.strip()
    assert records[-1]["id"] == resp.id
    assert records[-1]["completion_tokens"] == 6


async def test_completions_stream_and_not_via_sdk() -> None:
    async with running_sim("tiny", **FAST) as sim, client(sim.url) as c:
        stream = await c.completions.create(model="m", prompt="a" * 41, max_tokens=5,
                                            stream=True, stream_options={"include_usage": True})
        chunks = [x async for x in stream]
        whole = await c.completions.create(model="m", prompt=[1, 2, 3], max_tokens=4)
    texts = [x.choices[0].text for x in chunks if x.choices and x.choices[0].text]
    assert len(texts) == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (11, 5)
    assert whole.object == "text_completion"
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (3, 4)
    assert whole.choices[0].text.strip()


async def test_multi_token_chunks_with_continuous_usage() -> None:
    """tokens_per_chunk=3: the first chunk (from prefill) holds 1 token, then 3 per chunk;
    with continuous_usage_stats every chunk carries the running usage."""
    async with running_sim("tiny", tokens_per_chunk=3, **FAST) as sim, client(sim.url) as c:
        stream = await c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10,
            stream=True, stream_options={"include_usage": True,
                                         "continuous_usage_stats": True})
        chunks = [c async for c in stream]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in content if c.usage]
    assert counts == [1, 4, 7, 10]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10


async def test_length_from_distribution_when_no_max_tokens() -> None:
    async with running_sim("tiny", output_tokens_dist="fixed", output_tokens_mean=5,
                           **FAST) as sim, client(sim.url) as c:
        resp = await c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 5
    assert resp.choices[0].finish_reason == "stop"


async def test_bad_requests_are_400() -> None:
    async with (running_sim("tiny", max_model_len=100, kv_cache_tokens=100, **FAST) as sim,
                client(sim.url) as c):
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x" * 400}], max_tokens=10)
        with pytest.raises(openai.BadRequestError, match="messages"):
            await c.chat.completions.create(model="m", messages=[], max_tokens=10)
        status, _, body = await post_raw(sim.url + "/v1/completions", {"prompt": 3})
        assert status == 400
        assert "prompt" in json.loads(body)["error"]["message"]
        assert sim.engine.state()["waiting"] == 0


async def test_models_and_health() -> None:
    async with running_sim("tiny") as sim, client(sim.url) as c:
        models = await c.models.list()
        assert [m.id for m in models.data] == ["sim-tiny"]
        assert (await get_json(sim.url + "/v1/models"))["data"][0]["max_model_len"] == 2048
        status, _, _ = await _get(sim.url + "/health")
        assert status == 200


async def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, dict(r.headers), await r.read()
