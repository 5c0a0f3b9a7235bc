"""``/v1/completions`` with a list of prompts (a batch): vLLM answers one choice per prompt
with their usage summed. The simulator serves one prompt and ``n`` of 1 (it refuses
``n: 2`` with a 400); a batch was answered as if only its first prompt had been sent, one
choice and the first prompt's usage, so a test driving a batch through it got a ground
truth that was not the request's. It is refused as ``n`` is."""

from __future__ import annotations

import json

import pytest
from sim_support import post_raw

from llmtop.sim.server import running_sim


@pytest.mark.parametrize("prompt", [["first prompt", "second"], [[1, 2, 3], [4, 5]], []])
async def test_a_batch_of_prompts_is_refused_not_half_answered(prompt: list[object]) -> None:
    async with running_sim("tiny", time_scale=0.05) as sim:
        status, _, raw = await post_raw(sim.url + "/v1/completions",
                                        {"prompt": prompt, "max_tokens": 2})
        assert status == 400, raw
        assert json.loads(raw)["error"]["type"] == "BadRequestError"
        assert sim.engine.records() == []
        # one prompt, as a string, token ids or a one-element list of either: served
        for one in ("abcdefgh", [1, 2, 3], ["abcdefgh"], [[1, 2, 3]]):
            status, _, raw = await post_raw(sim.url + "/v1/completions",
                                            {"prompt": one, "max_tokens": 2})
            assert status == 200, raw
            body = json.loads(raw)
            assert len(body["choices"]) == 1
            assert body["usage"]["prompt_tokens"] in (2, 3)
