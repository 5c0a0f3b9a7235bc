"""UPSTREAM_STALLED: a hung engine accepts requests and never answers (a deadlocked
engine core behind a live HTTP server). Nothing else tells it: QUEUEING needs the engine
seen serving, ERRORS waits for the first-byte timeouts (minutes), UPSTREAM_DOWN for failed
connects. Real sockets: the upstream is an aiohttp server whose handler hangs until told
to answer; the warning names the figures and clears once tokens flow again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from sat_scenario_support import SCALE, ClosedLoop, pipeline
from test_saturation_unit import Harness, healthy_traffic, record

from llmtop.config import load_config
from llmtop.events import ActiveRequest
from llmtop.saturation import SaturationMonitor


class _Engine:
    """An OpenAI-style streaming endpoint that can hang: while ``hung`` is not set,
    requests are accepted and wait (no byte goes back)."""

    def __init__(self) -> None:
        self.serving = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        await self.serving.wait()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(4):
            chunk = {"model": "m", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.02)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        self.serving.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def engine() -> AsyncIterator[_Engine]:
    e = _Engine()
    await e.start()
    yield e
    await e.stop()


class _Slot:
    def __init__(self, url: str) -> None:
        self.url = url
        self.handle = None


async def test_a_hung_engine_is_upstream_stalled_and_clears_when_it_serves(
        engine: _Engine) -> None:
    """The ITL objective is 1 s, not the scenarios' 200 ms: the three requests in flight
    stream 4 chunks each (3 ITL samples, whose P95 is their largest), so one pause of the
    test process over 200 ms while they streamed (client, proxy and engine share it) made
    all three miss at once (SLO_ITL: 94 % of 51, on one 0.26 s freeze). The hang itself must
    still raise no SLO_ITL: its 4 s before the first token counted as a gap would miss 1 s
    too."""
    stall = 6 * SCALE
    async with pipeline(_Slot(engine.url), **{"warnings.stall_s": stall,  # type: ignore[arg-type]
                                               "slo.itl_p95_s": 1.0}) as p:
        load = ClosedLoop(p.url, 3, max_tokens=4)
        raised = await p.wait_for("UPSTREAM_STALLED", within=stall + 20 * SCALE)
        assert raised is not None, p.describe()
        msg = p.message("UPSTREAM_STALLED")
        engine.serving.set()  # it recovers: tokens flow
        cleared = await p.wait_for("UPSTREAM_STALLED", "cleared", within=40 * SCALE)
        await load.stop(drain_s=0.5)
    assert "engine stalled: 3 streamed requests waiting for a first token" in msg, msg
    assert engine.url in msg and "hung" in msg
    assert cleared is not None, p.describe()
    # the incident is this warning's: not a queue, not errors, not an outage (the stalled
    # requests did miss the TTFT SLO once answered: SLO_TTFT may say so, rightly)
    assert p.raised_codes() - {"SLO_TTFT"} == {"UPSTREAM_STALLED"}, p.describe()


def _harness(stall_s: float) -> Harness:
    h = Harness()
    h.mon = SaturationMonitor(load_config(None, env={}, overrides={"warnings.stall_s": stall_s}),
                              h.events.append, h.active, upstream_down=lambda: h.down)
    return h


def _waiting(h: Harness, rid: str, age_s: float, stream: bool = True) -> ActiveRequest:
    a = ActiveRequest(rid, "u", "m", "openai", "/v1/chat/completions", stream,
                      h.now - age_s, int((h.now - age_s) * 1e9))
    h.active[rid] = a
    return a


def test_a_long_answer_that_streams_or_a_non_streamed_wait_is_not_a_stall() -> None:
    """One request streaming tokens, or non-streamed requests (no first token until the
    whole answer), with others waiting past stall_s: the engine is alive or cannot tell."""
    h = _harness(5.0)
    healthy_traffic(h, 10)
    streaming = _waiting(h, "s", 0.0)
    streaming.first_token_ns = int(h.now * 1e9)
    for _ in range(20):
        streaming.last_chunk_ns = int(h.now * 1e9)  # a token every tick
        _waiting(h, "w", 8.0)  # a request waiting behind it, past stall_s
        h.step()
    assert "UPSTREAM_STALLED" not in h.codes(), h.mon.raised()
    h.active.clear()
    for i in range(20):
        _waiting(h, f"n{i % 3}", 8.0 + i, stream=False)
        h.step()
    assert "UPSTREAM_STALLED" not in h.codes(), h.mon.raised()


def test_streamed_requests_waiting_with_nothing_back_raise_it_at_stall_s() -> None:
    h = _harness(5.0)
    healthy_traffic(h, 10)  # the engine answered until now
    for _ in range(4):  # silent 4 s: not yet
        _waiting(h, "a", 4.5)
        h.step()
    assert "UPSTREAM_STALLED" not in h.codes(), h.mon.raised()
    for _ in range(6):
        _waiting(h, "a", 9.0)
        h.step()
    assert h.codes() == ["UPSTREAM_STALLED"], h.mon.raised()
    h.down = True  # the proxy now fails to connect: that is the outage's warning
    for _ in range(20):
        h.step()
    assert "UPSTREAM_DOWN" in h.codes() and h.codes("cleared") == ["UPSTREAM_STALLED"]


@pytest.mark.parametrize(("status", "outcome", "alive"), [
    (200, "ok", True),  # an answer
    (429, "error", True),  # the engine refused it: it is there and answering
    (499, "error", False),  # the proxy's own code for a client that left: no sign of life
    (500, "error", False),  # a 5xx with no first token (a gateway in front of a hung engine)
    (504, "timeout", False),  # no first byte in time
])
def test_what_the_engine_sends_back_while_streams_wait_is_a_sign_of_life_or_not(
        status: int, outcome: str, alive: bool) -> None:
    """Requests waiting past stall_s while other requests end: an answer or the engine's
    own refusal (4xx) shows it is alive; the proxy's 499, 502 and 504 do not. (The
    detector keeps the latest answer as the records come: ``Signals.last_answer``.)"""
    h = _harness(5.0)
    healthy_traffic(h, 10)
    for i in range(12):
        _waiting(h, "a", 9.0 + i)
        h.feed(record(h.now - 0.5, outcome=outcome, status=status, n=1))
        h.step()
    assert ("UPSTREAM_STALLED" in h.codes()) is not alive, h.mon.raised()
