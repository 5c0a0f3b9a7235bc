"""bench's token counts are the engine's, as the proxy's are for the same requests.

Prompt tokens: bench recorded the workload's *target* length for a request whose answer
carried no usage (refused with 503, or broken off mid-stream), where the engine had read
71 tokens (its chat template adds to the 64 asked for) and the proxy recorded none:
``llmtop report`` of bench's recording of three refused requests read 384 input tokens
(3 × 128), the proxy's recording of them 0.
"""

from __future__ import annotations

import random

from llmtop.bench.client import BenchClient, bench_session
from llmtop.bench.workload import BenchRequest, synth_prompt
from llmtop.sim.server import running_sim

SIM_PROMPT = 71
"""What the simulator's chat template makes of the 64-token prompt below."""


def request(max_tokens: int) -> BenchRequest:
    return BenchRequest(synth_prompt(random.Random(1), 64), 64, max_tokens)


async def test_prompt_tokens_are_the_engines_count_or_none() -> None:
    async with running_sim("tiny", seed=1) as sim:
        ok = BenchClient(sim.url)
        refused = BenchClient(sim.url, headers={"X-Sim-Fault": "status:503"})
        broken = BenchClient(sim.url, headers={"X-Sim-Fault": "disconnect-after:3"})
        async with bench_session(4) as s:
            recs = [await ok.send(s, request(8)), await refused.send(s, request(8)),
                    await broken.send(s, request(8))]
        truth = [t["prompt_tokens"] for t in sim.engine.records()]
    assert [r.outcome for r in recs] == ["ok", "error", "error"]
    assert truth == [SIM_PROMPT, SIM_PROMPT]  # the refused one never reached the engine
    assert [r.prompt_tokens for r in recs] == [SIM_PROMPT, None, None]

