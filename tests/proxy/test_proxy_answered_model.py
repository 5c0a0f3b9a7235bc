"""An engine may answer under another name than the request asked for (OpenAI answers
``gpt-4o`` as ``gpt-4o-2024-08-06``). The chunk slices and the record took the answer's
name, but the live row kept the asked-for one, so a TTFT filed while the stream was open
went under ``gpt-4o`` and its chunks and record under the dated name (the take-back
helper's note). The live row now takes the answer's name with its first token."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

SSE = {"Content-Type": "text/event-stream"}


async def test_the_live_row_takes_the_answers_model_name() -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks([" a"] * 8, model="gpt-4o-2024-08-06"),
                           headers=SSE, gap_s=0.1)
        async with running_proxy(up.url, inject_usage=False) as (proxy, url, recs), \
                aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", data=json.dumps(body)) as r:
                seen: list[str | None] = []
                async for _ in r.content.iter_any():
                    rows = list(proxy.active.values())
                    if rows and rows[0].first_token_ns is not None:
                        seen.append(rows[0].model)
                    await asyncio.sleep(0)
            (rec,) = await recs.wait(1)
    assert seen and set(seen) == {"gpt-4o-2024-08-06"}, seen
    assert rec.model == "gpt-4o-2024-08-06"
