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


async def test_a_broken_stream_is_counted_at_the_learned_tokens_per_event() -> None:
    """An engine that packs 3 tokens an event (speculative decoding, a stream interval):
    a stream broken after 10 events carried 1 + 9 × 3 = 28 tokens. bench counted 10 (one
    per event) where the proxy in front, which learns the rate from complete streams,
    recorded 28 (``estimate``) — output tokens/s a third of the truth for broken streams.
    Now bench learns the rate from its own complete streams by the proxy's rule."""
    async with running_sim("tiny", seed=1, tokens_per_chunk=3) as sim:
        client = BenchClient(sim.url, headers={"X-Sim-Fault": "disconnect-after:10"})
        async with bench_session(1) as s:
            first = await client.send(s, request(4))  # 2 events: too few to learn from
            early = await client.send(s, request(40))
            whole = await client.send(s, request(22))  # 8 events: 1 + 7 × 3
            late = await client.send(s, request(40))
        delivered = [len(t["chunks"]) for t in sim.engine.records()]
    assert [r.outcome for r in (first, whole)] == ["ok", "ok"]
    assert (whole.completion_tokens, whole.token_source) == (22, "usage")
    assert delivered[1] == delivered[3] == 10  # events written before the disconnect
    # nothing learned yet: one token per event, as the proxy does before it has a rate
    assert (early.outcome, early.completion_tokens, early.token_source) == (
        "error", 10, "chunks")
    assert (late.outcome, late.completion_tokens, late.token_source) == (
        "error", 28, "estimate")
    assert late.chunk_tokens == (1, *[3] * 9)
