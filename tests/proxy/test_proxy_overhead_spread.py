"""benchmarks/proxy_overhead.py ``--spread``: the load generator's requests ask for answers
of different lengths (so streams started together do not keep ending together), the same
lengths in the same order for every target; without it, every request asks for one."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from proxy_overhead import run_load, spread_tokens

from llmtop.sim.server import running_sim


def test_no_spread_is_one_length() -> None:
    assert spread_tokens(32, 0.0) == [32]


@pytest.mark.parametrize(("tokens", "spread", "lo", "hi"),
                         [(32, 0.5, 16, 48), (10, 0.25, 8, 12), (2, 0.9, 1, 4)])
def test_every_length_of_the_range_once(tokens: int, spread: float, lo: int, hi: int) -> None:
    got = spread_tokens(tokens, spread)
    assert sorted(got) == list(range(lo, hi + 1))
    assert got == spread_tokens(tokens, spread)  # the same order every time
    assert got != sorted(got)  # shuffled: consecutive requests differ by more than one


async def test_the_engine_is_asked_for_the_lengths() -> None:
    async with running_sim("tiny", seed=1, firehose=True) as sim:
        phase = await run_load(sim.url, 3, 0.6, 6, False, spread=0.5)
        async with aiohttp.ClientSession() as s, s.get(sim.url + "/sim/requests") as r:
            truth = {t["id"]: t for t in await r.json()}
    done = [req for req in phase.results if req.rid in truth]
    assert len(done) >= 10 and phase.errors == 0
    # each answer as long as its request asked (a max_tokens makes the simulator generate
    # exactly that many: ignore_eos), and
    # the lengths the range holds, all of them over enough requests
    lengths = [len(truth[req.rid]["chunks"]) for req in done]
    assert all(len(req.times) == n for req, n in zip(done, lengths, strict=True))
    assert set(lengths) == set(range(3, 10))
