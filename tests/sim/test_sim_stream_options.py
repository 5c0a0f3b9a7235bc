"""``stream_options`` on the OpenAI routes, read as vLLM reads them (its
``should_include_usage``): ``continuous_usage_stats`` counts only together with
``include_usage``."""

from __future__ import annotations

import json

from sim_support import chat_body, post_raw, sse_events

from llmtop.sim.server import running_sim

FAST = {"time_scale": 0.05}


async def test_continuous_usage_alone_sends_no_usage() -> None:
    """vLLM sets continuous usage to ``include_usage and continuous_usage_stats``: asked
    alone, no chunk carries usage. The simulator sent usage in every chunk and a usage-only
    chunk at the end, so a test of what a client that asked for no usage sees (the proxy's
    include_usage injection and stripping) could not see what vLLM does."""
    async with running_sim("tiny", **FAST) as sim:
        for path, body in (
            ("/v1/chat/completions", chat_body(4)),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "stream": True}),
        ):
            body["stream_options"] = {"continuous_usage_stats": True}
            status, _, raw = await post_raw(sim.url + path, body)
            assert status == 200, raw
            assert b'"usage"' not in raw, raw.decode()
            datas = [data for _, data in sse_events(raw)]
            assert datas[-1] == "[DONE]" and len(datas) >= 5
            # both asked: usage in every chunk, then the usage-only chunk
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
            status, _, raw = await post_raw(sim.url + path, body)
            datas = [data for _, data in sse_events(raw)][:-1]
            assert status == 200 and all('"usage":{' in d for d in datas), raw.decode()


async def test_stream_options_without_stream_is_a_400_as_vllm_answers_it() -> None:
    """vLLM's request models refuse ``stream_options`` unless ``stream`` is true
    ("Stream options can only be defined when `stream=True`."); the simulator answered, so
    a client (or a proxy adding the option) that vLLM refuses passed against it."""
    async with running_sim("tiny", **FAST) as sim:
        for path, body in (
            ("/v1/chat/completions", chat_body(2, stream=False)),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ):
            body["stream_options"] = {"include_usage": True}
            status, _, raw = await post_raw(sim.url + path, body)
            assert status == 400, raw
            assert "stream=True" in json.loads(raw)["error"]["message"]
            # an empty or null stream_options is no option at all, as in vLLM
            for empty in ({}, None):
                body["stream_options"] = empty
                status, _, raw = await post_raw(sim.url + path, body)
                assert status == 200, raw
        assert len(sim.engine.records()) == 4
