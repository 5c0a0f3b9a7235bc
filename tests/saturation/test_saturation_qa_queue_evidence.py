"""QA: without the engine's queue (no /metrics: Ollama, a hosted API, scraping off), QUEUEING
took any of the proxy's requests without a first token as a queue. Two cases that are not
saturation raised it:

- a single slow request — one 100k-token prompt in prefill for 12 s, nothing else in
  flight: "saturated: 1 in flight, 1 of them without a first token yet ... TTFT p95
  100 ms→11.50 s; consider more replicas";
- an upstream that has stopped answering: requests sit in flight until their connect
  times out (10 s by default), and QUEUEING was raised ~5 s in, before any of them ended.

A queue is requests waiting while the engine serves others; the proxy's own evidence now
counts only while the engine is seen serving: a stream of this proxy flowing, a first token
or an answer in the same stretch. (With the engine's queue, that is the evidence.)"""

from __future__ import annotations

import asyncio

from sat_scenario_support import SCALE, ClosedLoop, pipeline
from test_saturation_qa_outage import _Slot, blackhole
from test_saturation_unit import Harness, healthy_traffic

from llmtop.events import ActiveRequest, EngineReading


def _lone(h: Harness, t0: float) -> None:
    h.active.clear()
    h.active["big"] = ActiveRequest(id="big", user="u", model="m", dialect="openai", path="/",
                                    stream=True, t_start=t0, t0_ns=int(t0 * 1e9))


def test_a_single_slow_request_is_not_a_queue() -> None:
    h = Harness()
    healthy_traffic(h, 30)
    t0 = h.now + 0.5
    for _ in range(15):
        _lone(h, t0)
        h.step()
    assert "QUEUEING" not in h.codes(), h.mon.raised()


def test_requests_waiting_on_an_upstream_that_serves_nobody_are_not_a_queue() -> None:
    h = Harness()
    healthy_traffic(h, 30)
    for i in range(9):  # the first 9 s of a dead upstream: nothing ends, nothing streams
        h.set_waiting(4, age_s=min(i + 1.0, 9.0))
        h.step()
    assert "QUEUEING" not in h.codes(), h.mon.raised()


def test_requests_waiting_while_others_stream_are_a_queue() -> None:
    """The same four requests waiting while two others stream: QUEUEING."""
    h = Harness()
    healthy_traffic(h, 30)
    for i in range(12):
        h.set_waiting(4, age_s=min(i + 1.0, 9.0))
        for j in range(2):
            t = h.now - 3.0
            h.active[f"s{j}"] = ActiveRequest(
                id=f"s{j}", user="u", model="m", dialect="openai", path="/", stream=True,
                t_start=t, t0_ns=int(t * 1e9), first_token_ns=int((t + 0.1) * 1e9))
        h.step()
    assert "QUEUEING" in h.codes(), h.mon.raised()


def test_the_engine_queue_is_evidence_of_its_own() -> None:
    """With the engine's queue reading, a lone request of this proxy waiting behind other
    clients' requests is QUEUEING (the engine says so)."""
    h = Harness()
    healthy_traffic(h, 30)
    t0 = h.now + 0.5
    for _ in range(15):
        _lone(h, t0)
        h.feed(EngineReading(t=h.now, kind="vllm", running=8, waiting=5))
        h.step()
    assert "QUEUEING" in h.codes(), h.mon.raised()


async def test_a_dead_upstream_is_not_queueing_before_its_first_connect_timeout() -> None:
    """Real sockets: a host that drops connection attempts, the default connect timeout
    (10 s, compressed): no QUEUEING while the first requests wait, UPSTREAM_DOWN once
    they time out."""
    with blackhole() as url:
        async with pipeline(_Slot(url), **{"timeouts.connect_s": 10 * SCALE}) as p:  # type: ignore[arg-type]
            load = ClosedLoop(p.url, 4, max_tokens=16)
            raised = await p.wait_for("UPSTREAM_DOWN", within=30 * SCALE)
            await asyncio.sleep(4 * SCALE)
            await load.stop(drain_s=0.1)
    assert raised is not None, p.describe()
    assert p.raised_codes() == {"UPSTREAM_DOWN"}, p.describe()
