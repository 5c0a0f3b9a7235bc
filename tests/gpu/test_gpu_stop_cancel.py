"""GpuSourceHandle.stop when the task stopping it is cancelled meanwhile (a Ctrl-C while
bench or the proxy shuts down): the cancel reaches that task, it is not swallowed with the
poller's own."""

from __future__ import annotations

import asyncio

import pytest

from llmtop.config import Config
from llmtop.events import Event
from llmtop.gpu import open_gpu_source


async def test_a_cancel_while_the_sim_poller_stops_is_not_swallowed() -> None:
    cfg = Config()
    cfg.gpu.source, cfg.gpu.interval_s = "sim", 0.02
    out: list[Event] = []
    h = open_gpu_source(cfg, out.append, upstream="http://127.0.0.1:9")  # nothing listens
    h.start()
    await asyncio.sleep(0.05)  # the poller is in its loop
    stopping = asyncio.create_task(h.stop())
    await asyncio.sleep(0)  # stop() has cancelled the poller and waits for it to end
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert h.status == "stopped"
    await h.stop()  # idempotent: nothing left to wait for
