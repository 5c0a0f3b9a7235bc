"""The record's ``stream``: whether the answer was streamed — and for an error page (never
streamed) what the request asked, as for the proxy's own 502/504 (QA: an upstream 500 to a
streaming request said ``stream: false``, an unreachable upstream's 502 ``true``)."""

from __future__ import annotations

import aiohttp
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
ERROR = b'{"error":{"message":"boom","type":"server_error"}}'


async def test_stream_flag_for_errors_is_the_requests() -> None:
    async with scripted_upstream() as up, \
            running_proxy(up.url, inject_usage=False) as (_, url, recs), \
            aiohttp.ClientSession() as s:
        cases = [
            (True, Script(chunks=[ERROR], status=500, headers=JSON, content_length=True)),
            (False, Script(chunks=[ERROR], status=429, headers=JSON, content_length=True)),
            # asked to stream, answered whole: not streamed
            (True, Script(chunks=[b'{"choices":[{"message":{"content":"hi"}}]}'],
                          headers=JSON, content_length=True)),
            (True, Script(chunks=openai_chunks(["hi"]),
                          headers={"Content-Type": "text/event-stream"})),
        ]
        for stream, script in cases:
            up.script = script
            async with s.post(url + CHAT, json={"model": "m", "stream": stream}) as r:
                await r.read()
        records = await recs.wait(4)
    assert [(r.status, r.stream) for r in records] == [
        (500, True), (429, False), (200, False), (200, True)]
