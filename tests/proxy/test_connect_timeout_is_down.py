"""An upstream whose host drops connection attempts is down, as one that refuses them:
the proxy's ``upstream_down`` flag (the saturation monitor's first clue) and the record's
``upstream_unreachable`` (kept out of the capacity bins) say so for a connect that timed
out as for a refused one (only refusals did)."""

from __future__ import annotations

import aiohttp
from net_support import blackhole
from test_proxy_support import running_proxy

from llmtop.events import RequestRecord


async def test_a_connect_that_times_out_marks_the_upstream_down() -> None:
    with blackhole() as url:
        async with running_proxy(url, timeouts__connect_s=0.3) as (proxy, purl, recs), \
                aiohttp.ClientSession() as s:
            assert not proxy.upstream_down
            async with s.post(purl + "/v1/chat/completions",
                              json={"model": "m", "stream": True, "messages": []}) as r:
                body = await r.json()
            (rec,) = await recs.wait(1)
            down = proxy.upstream_down
    assert r.status == 504 and body["error"]["code"] == "upstream_timeout"
    assert down
    assert rec.error is not None and rec.error.startswith("upstream connect timed out")
    assert rec.upstream_unreachable


def test_only_the_proxys_own_connect_failures_are_unreachable() -> None:
    def rec(status: int, error: str | None, ttft: float | None = None) -> RequestRecord:
        return RequestRecord(
            id="r", user="u", model=None, dialect="openai", path="/", stream=True,
            status=status, outcome="timeout" if status == 504 else "error", t_start=0.0,
            ttft_s=ttft, e2e_s=1.0, prompt_tokens=None, completion_tokens=None,
            token_source="chunks", error=error)

    assert rec(502, "upstream unreachable: refused").upstream_unreachable
    assert rec(504, "upstream connect timed out: 0.3 s").upstream_unreachable
    # an engine that was reached and then was slow is load, not an outage
    assert not rec(504, "upstream first byte timed out after 600 s").upstream_unreachable
    assert not rec(504, "upstream connect timed out", ttft=0.1).upstream_unreachable
    assert not rec(502, "upstream failed before responding: reset").upstream_unreachable
