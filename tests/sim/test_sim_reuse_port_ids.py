"""Simulators sharing a port (``--reuse-port``) hand out different request ids even with
one seed: with the same ids, whatever joins requests by the engine's id (llmtop's
``upstream_id``, a log grep) read two processes' requests as one. Without
``--reuse-port`` the seed still fixes the ids. Real ``llmtop sim`` processes."""

from __future__ import annotations

import aiohttp
from test_sim_cli import _start, _stop

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def _first_id(*args: str) -> str:
    proc, url = await _start("--listen", "127.0.0.1:0", "--firehose", *args)
    try:
        async with aiohttp.ClientSession() as s, \
                s.post(url + "/v1/chat/completions", json=BODY) as r:
            assert r.status == 200
            rid = (await r.json())["id"]
    finally:
        assert await _stop(proc) == 0
    assert isinstance(rid, str) and rid.startswith("chatcmpl-")
    return rid


async def test_reuse_port_processes_differ_in_ids_plain_ones_repeat_the_seeds() -> None:
    shared = [await _first_id("--reuse-port", "--seed", "3") for _ in range(2)]
    assert shared[0] != shared[1]
    plain = [await _first_id("--seed", "3") for _ in range(2)]
    assert plain[0] == plain[1]
    assert plain[0] not in shared
