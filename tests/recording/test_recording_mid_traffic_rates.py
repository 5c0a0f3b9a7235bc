"""A recording started mid-traffic: its rates are the tokens streamed inside its span.

The simulator behind llmtop's proxy, two long streams and a steady flow of short ones; the
recording is started through the admin API while all of them are open, and stopped once
they are done. The recording then holds requests that began before its ``started_at``
(their chunks before it too) but not the short ones that ended before it. The report ran
its rates from the start of the first request it read over every token of the requests
it holds (here ~1,120 tokens over 4.8 s: 234 tok/s, the long streams' user 133, against
the 199 and 98 the client received in the recording's 4.4 s). Now every rate runs over the
recording's span (``started_at``, or its first event when that is a moment earlier, to
its last event) and counts only the output tokens streamed inside it; the report and the
replay (the engine the TUI's replay runs) end on the same figures, and the hlog export's
base time is that ``started_at``. Checked against the client's own count of what it
received in the span, by its clock.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmtop.config import load_config
from llmtop.events import RequestRecord
from llmtop.recording.hlog import export_hlog
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplayEngine
from llmtop.recording.report.analyse import analyse
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

pytestmark = pytest.mark.timeout(90)

LONG_TOKENS = 320
"""Two streams of this many tokens (~6 s at the tiny profile's ~50 tok/s a stream)."""
SHORT_TOKENS = 20
RECORD_AFTER_S = 2.0
"""When the recording starts: both long streams (and some short ones) are open."""


async def stream(c: openai.AsyncOpenAI, user: str, max_tokens: int,
                 stamps: list[float]) -> None:
    """One streamed chat completion; the unix time each content chunk (one token: the
    tiny profile's ``tokens_per_chunk``) arrived is appended to ``stamps``."""
    s = await c.chat.completions.create(
        model="sim-tiny", messages=[{"role": "user", "content": "hello there"}],
        max_tokens=max_tokens, stream=True, extra_headers={"X-LLMTOP-User": user})
    async for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.time())


async def record_mid_traffic(path: Path) -> dict[str, list[float]]:
    """Run the traffic, recording from RECORD_AFTER_S in; the client's chunk times per
    user."""
    stamps: dict[str, list[float]] = {"long": [], "short": []}
    async with running_sim("tiny", seed=5) as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "none", "recording.flush_s": 0.1,
            # every request meets the objectives: goodput is all the output
            "slo.ttft_s": 30.0, "slo.itl_p95_s": 5.0})
        server = LlmtopServer(cfg, out=io.StringIO())
        await server.start()
        try:
            api = server.admin_url + "/llmtop/v1/recording"
            async with openai.AsyncOpenAI(base_url=server.proxy_url + "/v1", api_key="sk-x",
                                          max_retries=0) as c, aiohttp.ClientSession() as s:
                done = asyncio.Event()

                async def shorts() -> None:
                    while not done.is_set():
                        await stream(c, "short", SHORT_TOKENS, stamps["short"])

                longs = [asyncio.create_task(stream(c, "long", LONG_TOKENS, stamps["long"]))
                         for _ in range(2)]
                flow = [asyncio.create_task(shorts()) for _ in range(2)]
                await asyncio.sleep(RECORD_AFTER_S)
                assert not any(t.done() for t in longs)
                async with s.post(api, json={"action": "start", "path": str(path)}) as r:
                    assert r.status == 200, await r.text()
                await asyncio.gather(*longs)
                done.set()
                await asyncio.gather(*flow)
                await asyncio.sleep(0.3)  # the last records reach the recorder
                async with s.post(api, json={"action": "stop"}) as r:
                    assert r.status == 200, await r.text()
        finally:
            await server.stop()
    return stamps


def in_span(stamps: list[float], begin: float, end: float) -> int:
    return sum(1 for t in stamps if begin <= t <= end)


async def test_rates_count_the_tokens_streamed_inside_the_recordings_span(
        tmp_path: Path) -> None:
    path = tmp_path / "mid.jsonl"
    stamps = await record_mid_traffic(path)
    with RecordingReader(path) as rd:
        recs = [e for e in rd if isinstance(e, RequestRecord)]
        started = float(rd.header["started_at"])
    # the situation: requests begun before the recording (the long ones among them)
    early = [r for r in recs if r.t_start < started]
    assert {r.user for r in early} >= {"long"}, early
    assert sum(t < started for t in stamps["short"]) > SHORT_TOKENS  # shorts ended before

    rep = analyse(path)
    th, c = rep["throughput"], rep["conditions"]
    # the span: the recording's start, or its first event when that is a moment earlier (a
    # request that ended as the recorder started, handed to it after), to its last event
    begin = min(started, float(c["first_event_at"]))
    assert begin > started - 0.5
    end = float(c["last_event_at"])
    span = end - begin
    want = {u: in_span(stamps[u], begin, end) for u in stamps}
    want_all = sum(want.values())
    # the client stamps a chunk a moment after the proxy did: a few tokens at the start
    # may fall on the other side (2 of ~870 here; every token of the requests, which the
    # report counted before, is ~1,120 over a span of its own, 4.8 s for 4.4: 234 tok/s
    # against 199)
    assert th["output_tokens"] == pytest.approx(want_all, rel=0.015)
    assert th["output_tps"] == pytest.approx(want_all / span, rel=0.02)
    assert th["span_s"] == pytest.approx(span, abs=1e-6)
    users = {u["user"]: u for u in rep["users"]}
    for u in ("long", "short"):
        assert users[u]["output_tps"] == pytest.approx(want[u] / span, rel=0.03), u
    # every request met the objectives and ended inside the recording: goodput is the
    # output streamed in the span, not every token of the requests that ended in it
    assert rep["slo"]["attainment"] == 1.0
    assert rep["slo"]["goodput_tps"] == pytest.approx(th["output_tps"], rel=0.005)
    # prompts sent before the recording started are not in its input tokens either
    assert th["input_tokens"] == sum(r.prompt_tokens or 0 for r in recs if r.t_start >= begin)
    assert c["requests_before_start"] == len(early)

    # the replay (the TUI's engine) ends on the same figures; the hlog's base is the start
    eng = ReplayEngine(path, tick_s=0.5)
    try:
        eng.run_to_end()
        assert eng.begin == begin
        snap: dict[str, Any] = eng.snapshot(None)
    finally:
        eng.close()
    assert snap["system"]["output_tokens"] == th["output_tokens"]
    assert snap["system"]["output_tps"] == pytest.approx(th["output_tps"], rel=1e-9)
    assert snap["system"]["goodput_tps"] == pytest.approx(rep["slo"]["goodput_tps"], rel=1e-9)
    export_hlog(path, tmp_path / "mid.hlog")
    base = next(ln for ln in (tmp_path / "mid.hlog").read_text().splitlines()
                if ln.startswith("#[BaseTime:"))
    assert base.startswith(f"#[BaseTime: {started:.3f} ")
