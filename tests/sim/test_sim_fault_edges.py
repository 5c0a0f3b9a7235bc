"""``X-Sim-Fault`` at the edges of an answer: a count the answer never reaches."""

from __future__ import annotations

import json

import aiohttp
import pytest
from sim_support import chat_body, post_raw, sse_events

from llmtop.sim.server import running_sim

FAST = {"time_scale": 0.05}


async def test_disconnect_after_more_tokens_than_the_answer_has_is_no_disconnect() -> None:
    """``disconnect-after:N`` drops a non-streamed answer "once N tokens are generated"
    (the fault's documentation), as a streamed one after N chunks: an answer of fewer
    tokens never gets there and ends normally. The non-streamed one was dropped anyway,
    where the same request streamed ended with its [DONE]."""
    async with running_sim("tiny", **FAST) as sim:
        fault = {"X-Sim-Fault": "disconnect-after:9"}
        status, _, raw = await post_raw(sim.url + "/v1/chat/completions", chat_body(5),
                                        headers=fault)
        assert status == 200
        assert [d for _, d in sse_events(raw)][-1] == "[DONE]"
        status, _, raw = await post_raw(sim.url + "/v1/chat/completions",
                                        chat_body(5, stream=False), headers=fault)
        assert status == 200, raw
        assert json.loads(raw)["usage"]["completion_tokens"] == 5
        # N reached (the last token is the N-th): dropped, with no body
        with pytest.raises(aiohttp.ClientError):
            await post_raw(sim.url + "/v1/chat/completions", chat_body(9, stream=False),
                           headers=fault)
        states = [r["state"] for r in sim.engine.records()]
    assert states == ["finished", "finished", "finished"]
