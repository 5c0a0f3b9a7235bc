"""Helpers for the admin API tests: an aggregator fed finished requests through a real bus,
and the admin app served over real aiohttp servers on 127.0.0.1 port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from llmtop.admin.routes import AdminContext, RecordingControl, make_admin_app
from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.writer import RecordingController

T0 = 1_796_000_000.0
UPSTREAM = "http://up:1"


def record(i: int, user: str, *, chunks: int = 5, t_start: float | None = None
           ) -> RequestRecord:
    """Request ``r{i}`` of ``user``, finished: ``chunks`` one-token chunks 20 ms apart after
    a 0.2 s first token, 10 prompt tokens; it starts at ``T0 + i`` unless told."""
    offs = tuple(0.2 + 0.02 * k for k in range(chunks))
    return RequestRecord(f"r{i}", user, "m", "openai", "/v1/chat/completions", True, 200, "ok",
                         T0 + i if t_start is None else t_start, 0.2, offs[-1], 10, chunks,
                         "usage", offs, (1,) * chunks, 1)


class FedAggregator:
    """An aggregator subscribed to a real bus, its clock ``now`` (set by hand, from ``T0``);
    with ``recording``, a real recording controller on the same bus."""

    def __init__(self, *, recording: bool = False) -> None:
        self.now = T0
        self.bus = EventBus()
        self.active: dict[str, ActiveRequest] = {}
        self.aggregator = Aggregator(Config(), self.active, clock=lambda: self.now,
                                     upstream=UPSTREAM)
        self.bus.subscribe(self.aggregator.on_events)
        self.recorder = (RecordingController(self.bus, header={"upstream": UPSTREAM, "slo": {}})
                         if recording else None)

    def publish(self, *records: RequestRecord) -> None:
        """Each record a second after the last (the clock moves first), drained at once."""
        for rec in records:
            self.now += 1.0
            self.bus.publish(rec)
            self.bus.drain()

    def finish(self, users: Sequence[str]) -> None:
        """One finished request from each user (:func:`record`, numbered from 0)."""
        self.publish(*(record(i, user) for i, user in enumerate(users)))

    def context(self, **kwargs: Any) -> AdminContext:
        """The admin context over this aggregator (and its recorder, if any)."""
        return AdminContext(aggregator=self.aggregator, active=self.active,
                            recording=self.recorder, **kwargs)


class AdminServers:
    """Apps served on 127.0.0.1 port 0 for one test; :meth:`close` stops any recording an
    admin context still runs, then cleans every server up."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []
        self._recorders: list[RecordingControl] = []

    async def serve(self, app: AdminContext | web.Application) -> str:
        """Serves ``app`` (an admin context: its admin app); returns its base URL."""
        if isinstance(app, AdminContext):
            if app.recording is not None:
                self._recorders.append(app.recording)
            app = make_admin_app(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def serve_admin(self, users: Sequence[str] = (), *, recording: bool = False) -> str:
        """A fresh :class:`FedAggregator` (with a recorder if ``recording``) that finished
        one request per user, its admin app served; returns the base URL."""
        fed = FedAggregator(recording=recording)
        fed.finish(users)
        return await self.serve(fed.context())

    async def close(self) -> None:
        for rec in self._recorders:
            if rec.status() is not None:
                rec.stop()
        for runner in self._runners:
            await runner.cleanup()


@asynccontextmanager
async def admin_servers() -> AsyncIterator[AdminServers]:
    servers = AdminServers()
    try:
        yield servers
    finally:
        await servers.close()
