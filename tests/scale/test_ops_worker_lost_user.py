"""A worker killed with requests open that its last report did not carry: each is counted
as a failed request (:func:`llmtop.worker_procs.unreported_lost`), its user unknown. That
user was the empty string: the snapshot got a user row with no name, and ``/metrics`` wrote
``llmtop_user_requests_total{outcome="error",user=""}``, which Prometheus stores without a
``user`` label at all (an empty label value is no label): ``sum by (user)`` shows a row
``{}`` and a ``user=~".+"`` selector misses those errors. Seen end to end (``llmtop run
--workers 2``, 10 streams opened, both workers SIGKILLed 0.15 s later): users
``[('127.0.0.1', 1), ('', 10)]``. They are now the user ``unknown``, as a request whose
client has no address is named."""

from __future__ import annotations

import asyncio
import os
import sys

from prometheus_client.parser import text_string_to_metric_families

from llmtop.config import Config
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import LlmtopCollector
from llmtop.worker_procs import Supervisor
from llmtop.workers import FleetActive


class Launcher:
    async def start(self, index: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)")


async def published_on_kill(slot: int, reported: int) -> list[Event]:
    """Worker 1's slot says ``slot`` open requests, its last report listed ``reported``
    (user alice); the process is SIGKILLed: what the coordinator publishes for it."""
    counts, path = FleetCounts.create(2)
    os.unlink(path)
    launcher = Launcher()
    procs = [await launcher.start(0), await launcher.start(1)]
    active = FleetActive()
    active.update(1, [ActiveRequest(f"w1-{i}", "alice", "m", "openai", "/v1", True, 0.0, 0)
                      for i in range(reported)], "s1")
    counts._slots[1] = slot
    published: list[Event] = []
    sup = Supervisor(launcher, procs, counts, active, lambda line: None,  # type: ignore[arg-type]
                     publish=published.append, first_delay_s=0.001)
    task = asyncio.create_task(sup.run())
    try:
        procs[1].kill()
        for _ in range(500):
            if sup.restarts:
                break
            await asyncio.sleep(0.01)
        assert sup.restarts == 1
    finally:
        await sup.stop_all(task, 1.0)
        counts.close()
    return published


async def test_unreported_lost_requests_are_the_user_unknown_not_a_blank_one() -> None:
    published = await published_on_kill(slot=5, reported=2)
    records = [e for e in published if isinstance(e, RequestRecord)]
    assert len(records) == 5
    assert all(r.user for r in records), [r.user for r in records]
    agg = Aggregator(Config(), {})
    agg.on_events(published)
    agg.tick()
    users = {u["user"]: u["requests"] for u in agg.snapshot(None)["users"]}
    assert users == {"alice": 2, "unknown": 3}
    text = LlmtopCollector(agg).exposition()[0].decode()
    errors = {s.labels["user"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "llmtop_user_requests_total"
              and s.labels["outcome"] == "error"}
    assert errors == {"alice": 2.0, "unknown": 3.0}
