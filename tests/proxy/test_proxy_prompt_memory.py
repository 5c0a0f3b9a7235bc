"""A streamed answer does not keep its prompt in the proxy.

Once the upstream's response head has come, a request is never sent again (no retry after
a head), so neither the client's body nor the bytes sent upstream are needed while the
answer streams — which can take minutes, over hundreds of streams with long prompts. Here
the proxy's own allocations are read with ``tracemalloc`` mid-stream: none is as large as
the prompt (aiohttp's path; the direct path's count is in ``test_proxy_direct``)."""

from __future__ import annotations

import asyncio
import io
import json
import tracemalloc

import aiohttp
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

PROMPT_BYTES = 1 << 19
"""(The scripted upstream, an aiohttp server, takes bodies up to 1 MiB.)"""


def _big_blocks_held_by_the_proxy() -> list[int]:
    """Sizes of live allocations of ≥ half the prompt made with the proxy's code on the
    stack (the scripted upstream's and the client's copies are not)."""
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*/llmtop/proxy/*", all_frames=True)])
    return [t.size for t in snap.traces if t.size >= PROMPT_BYTES // 2]


async def test_a_long_prompt_is_not_held_while_its_answer_streams() -> None:
    body = json.dumps({"model": "m1", "stream": True, "messages": [
        {"role": "user", "content": "x" * PROMPT_BYTES}]}).encode()
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c"]), gap_s=0.4,
                           headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            tracemalloc.start(40)
            try:
                async with s.post(url + "/v1/chat/completions", data=io.BytesIO(body),
                                  headers={"Content-Type": "application/json"}) as resp:
                    assert resp.status == 200
                    seen = b""
                    while b'"content":"a"' not in seen:
                        seen += await asyncio.wait_for(resp.content.readany(), 3)
                    held = _big_blocks_held_by_the_proxy()
                    rest = await resp.read()
            finally:
                tracemalloc.stop()
            (rec,) = await recs.wait(1)
    assert b"[DONE]" in rest and rec.outcome == "ok" and rec.completion_tokens == 3
    assert len(up.seen) == 1 and len(up.seen[0].body) > PROMPT_BYTES  # it went upstream whole
    assert held == [], f"the proxy holds {len(held)} prompt-sized blocks mid-stream: {held}"
