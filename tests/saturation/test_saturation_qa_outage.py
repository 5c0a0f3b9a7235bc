"""QA: an upstream host that does not answer connection attempts at all (down, firewalled,
a dead node behind a stale address: the SYN is dropped, not refused) is an outage, not
saturation. The proxy answers each request 504 after ``timeouts.connect_s``; meanwhile the
requests sit in flight without a first token. llmtop raised QUEUEING ("saturated ...
consider more replicas") and ERRORS ("timeouts point at overload") and never
UPSTREAM_DOWN. Reproduced over real sockets: the upstream is a listening socket whose
accept queue is full, so the kernel drops further SYNs."""

from __future__ import annotations

import asyncio

from net_support import blackhole
from sat_scenario_support import SCALE, ClosedLoop, pipeline
from test_saturation_unit import Harness, healthy_traffic

from llmtop.events import RequestRecord


class _Slot:
    """What ``pipeline`` reads of a simulator slot: its URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.handle = None


async def test_an_upstream_that_drops_connection_attempts_is_upstream_down_only() -> None:
    with blackhole() as url:
        async with pipeline(_Slot(url), **{"timeouts.connect_s": 4 * SCALE}) as p:  # type: ignore[arg-type]
            load = ClosedLoop(p.url, 4, max_tokens=16)
            raised = await p.wait_for("UPSTREAM_DOWN", within=30 * SCALE)
            await asyncio.sleep(10 * SCALE)
            await load.stop(drain_s=0.1)
    assert load.stats.statuses.get(504, 0) >= 4, load.stats
    assert raised is not None, p.describe()
    msg = p.message("UPSTREAM_DOWN")
    assert url in msg and "timed out" in msg, msg
    assert p.raised_codes() == {"UPSTREAM_DOWN"}, p.describe()


def _connect_timeout(t_start: float, i: int) -> RequestRecord:
    return RequestRecord(
        id=f"ct{t_start}{i}", user="u", model=None, dialect="openai", path="/", stream=True,
        status=504, outcome="timeout", t_start=t_start, ttft_s=None, e2e_s=10.0,
        prompt_tokens=None, completion_tokens=None, token_source="chunks",
        error="upstream connect timed out: 10 s")


def test_connect_timeouts_are_an_outage_not_errors_nor_a_queue() -> None:
    """The same at unit level: requests wait 10 s each for a connect that times out."""
    h = Harness()
    healthy_traffic(h, 30)
    for _ in range(40):
        h.set_waiting(4, age_s=5.0)
        h.feed(*[_connect_timeout(h.now - 10.0, i) for i in range(2)])
        h.step()
    assert h.codes() == ["UPSTREAM_DOWN"], h.mon.raised()
    h.set_waiting(0)
    healthy_traffic(h, 40)
    assert h.codes("cleared") == ["UPSTREAM_DOWN"], h.mon.raised()
