"""An answer without max_tokens that runs into the end of the context (max_model_len) ends
with ``length``, as vLLM's does (it sets max_tokens to what the context has left, and an
answer cut there finishes ``length``); the simulator cut it there but said ``stop``."""

from __future__ import annotations

import json

from sim_support import chat_body, metric_values, post_raw

from llmtop.sim.server import running_sim


async def test_an_answer_cut_by_the_context_ends_with_length() -> None:
    async with running_sim("tiny", output_tokens_dist="fixed", output_tokens_mean=100,
                           time_scale=0.05) as sim:
        # 4 + 2000 + 3 = 2007 prompt tokens: 41 left of max_model_len 2048
        status, _, raw = await post_raw(sim.url + "/v1/chat/completions",
                                        chat_body(None, stream=False, content="x" * 8000))
        assert status == 200, raw
        cut = json.loads(raw)
        status, _, raw = await post_raw(sim.url + "/v1/chat/completions",
                                        chat_body(None, stream=False))
        whole = json.loads(raw)
        metrics = await metric_values(sim.url)
    assert cut["usage"] == {"prompt_tokens": 2007, "completion_tokens": 41,
                            "total_tokens": 2048}
    assert cut["choices"][0]["finish_reason"] == "length"
    # the sampled length, where it fits, still ends as the model's own stop
    assert whole["usage"]["completion_tokens"] == 100
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert metrics['vllm:request_success_total{finished_reason=length}'] == 1
    assert metrics['vllm:request_success_total{finished_reason=stop}'] == 1
