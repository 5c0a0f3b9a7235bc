"""The proxy observed end to end as ``llmtop run`` wires it, for the metrics tests that
send real requests through it (to ``llmtop sim``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llmtop.bus import EventBus
from llmtop.config import load_config
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.proxy.server import ProxyServer

TICK_S = 0.1


@dataclass
class Observed:
    url: str
    agg: Aggregator
    t_created: float
    """The test's own clock (unix s) just before the aggregator was created."""
    records: list[RequestRecord] = field(default_factory=list)
    active: dict[str, ActiveRequest] = field(default_factory=dict)
    """The proxy's live registry, which the aggregator reads."""


@contextlib.asynccontextmanager
async def observed_proxy(upstream: str, **overrides: Any) -> AsyncIterator[Observed]:
    """A proxy to ``upstream`` (config ``overrides`` on top) observed as ``llmtop run``
    wires it: bus pump, an aggregator ticked every ``TICK_S``, the live registry."""
    cfg = load_config(env={}, overrides={"upstream": upstream, "listen": "127.0.0.1:0",
                                         **overrides})
    bus = EventBus()
    active: dict[str, ActiveRequest] = {}
    proxy = ProxyServer(cfg, bus, active)
    url = await proxy.start()
    t_created = time.time()
    obs = Observed(url, Aggregator(cfg, active, upstream=upstream), t_created, active=active)

    def take(batch: list[Event] | tuple[Event, ...] | Any) -> None:
        obs.records.extend(e for e in batch if isinstance(e, RequestRecord))

    bus.subscribe(obs.agg.on_events)
    bus.subscribe(take)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            obs.agg.tick()

    tasks = [asyncio.create_task(bus.pump(0.02)), asyncio.create_task(ticker())]
    try:
        yield obs
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await proxy.shutdown(1.0)
        bus.drain()
