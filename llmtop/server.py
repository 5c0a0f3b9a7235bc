"""Composition of one llmtop process: proxy → bus → metrics / recording / detectors, plus the
admin API and the GPU and engine samplers.

Everything here is wiring; the work lives in the packages it wires. The forwarding path
(``llmtop.proxy``) only publishes events to the bus; every observer runs on the other side
of ``EventBus.drain``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from aiohttp import web

from llmtop import __version__
from llmtop.admin.routes import AdminContext, make_admin_app
from llmtop.bus import EventBus
from llmtop.config import Config, parse_hostport, slo_dict
from llmtop.engines.scraper import EngineScraper, metrics_url_for
from llmtop.events import ActiveRequest
from llmtop.gpu import open_gpu_source
from llmtop.metrics.aggregator import Aggregator
from llmtop.proxy.server import ProxyServer
from llmtop.recording.writer import RecordingController
from llmtop.saturation import SaturationMonitor


@dataclass
class RunSummary:
    """What a headless run prints when it ends."""

    uptime_s: float
    requests: int
    errors: int
    cancelled_at_shutdown: int
    output_tokens: int
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"llmtop: served {self.requests} requests in {self.uptime_s:.1f} s "
            f"({self.errors} errors, {self.output_tokens} output tokens)",
        ]
        if self.cancelled_at_shutdown:
            out.append(
                f"llmtop: {self.cancelled_at_shutdown} in-flight streams were cancelled "
                "at the shutdown deadline"
            )
        out.extend(self.notes)
        return out


class LlmtopServer:
    """One proxy process: start() binds both addresses, stop() shuts down gracefully."""

    def __init__(self, cfg: Config, *, out: TextIO | None = None) -> None:
        self.cfg = cfg
        self.out = out or sys.stdout
        self.started_at = time.time()
        self.bus = EventBus()
        self.active: dict[str, ActiveRequest] = {}
        self.proxy = ProxyServer(cfg, self.bus, self.active)
        self.aggregator = Aggregator(cfg, self.active, upstream=cfg.upstream)
        self.bus.subscribe(self.aggregator.on_events)
        self.monitor = SaturationMonitor(
            cfg, self.bus.publish, self.active, upstream_down=lambda: self.proxy.upstream_down
        )
        self.bus.subscribe(self.monitor.on_events)
        self.recording = RecordingController(self.bus, header=self._recording_header())
        self._admin_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._gpu: Any = None
        self.proxy_url = ""
        self.admin_url = ""

    def _recording_header(self) -> dict[str, Any]:
        return {
            "upstream": self.cfg.upstream,
            "slo": slo_dict(self.cfg),
            "llmtop_version": __version__,
        }

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    async def start(self, *, reuse_port: bool = False) -> None:
        self.proxy_url = await self.proxy.start(reuse_port=reuse_port)
        self._say(f"llmtop: proxy listening on {self.proxy_url}")

        ctx = AdminContext(
            aggregator=self.aggregator,
            active=self.active,
            recording=self.recording,
            admin_token=self.cfg.admin_token,
            extra_info={"upstream": self.cfg.upstream, "llmtop_version": __version__},
        )
        app = make_admin_app(ctx)
        self._admin_runner = web.AppRunner(app, access_log=None)
        await self._admin_runner.setup()
        host, port = parse_hostport(self.cfg.admin, "admin")
        site = web.TCPSite(self._admin_runner, host, port)
        await site.start()
        sock = site._server.sockets[0] if site._server and site._server.sockets else None
        bound = sock.getsockname()[1] if sock is not None else port
        shown = f"[{host}]" if ":" in host else host
        self.admin_url = f"http://{shown}:{bound}"
        self._say(f"llmtop: admin listening on {self.admin_url}")

        self._tasks.append(asyncio.create_task(self.bus.pump(0.05), name="bus-pump"))
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="metrics-tick"))
        self._start_samplers()
        if self.cfg.recording.path:
            self.recording.start(self.cfg.recording.path)
            self._say(f"llmtop: recording to {self.cfg.recording.path}")

    def _start_samplers(self) -> None:
        cfg = self.cfg
        self._gpu = open_gpu_source(cfg, self.bus.publish, upstream=cfg.upstream)
        msg = self._gpu.start()
        if msg:
            self._say(f"llmtop: {msg}")
        if cfg.engine.enabled and cfg.upstream:
            url = metrics_url_for(cfg.upstream, cfg.engine.metrics_url)
            scraper = EngineScraper(url, None, self.bus.publish, interval_s=cfg.engine.interval_s)
            self._tasks.append(asyncio.create_task(scraper.run(), name="engine-scraper"))

    async def _tick_loop(self) -> None:
        """Rotate metric intervals twice a second; evaluate the detectors once a second."""
        n = 0
        while True:
            await asyncio.sleep(0.5)
            self.aggregator.tick()
            n += 1
            if n % 2 == 0:
                self.monitor.tick()

    async def stop(self, grace_s: float | None = None) -> RunSummary:
        summary = await self.proxy.shutdown(grace_s)
        self.bus.drain()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._gpu is not None:
            await self._gpu.stop()
        self.bus.drain()
        notes: list[str] = []
        status = self.recording.status()
        if status is not None:
            done = self.recording.stop()
            notes.append(
                f"llmtop: recording {done.get('path')}: {done.get('requests', 0)} requests"
                + (f", {done['dropped']} lines dropped" if done.get("dropped") else "")
            )
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        snap = self.aggregator.snapshot(None)
        system = snap.get("system", {})
        return RunSummary(
            uptime_s=time.time() - self.started_at,
            requests=int(system.get("requests", 0)),
            errors=int(system.get("errors", 0)),
            cancelled_at_shutdown=int(getattr(summary, "cancelled", 0)),
            output_tokens=int(snap.get("totals", {}).get("output_tokens", 0)),
            notes=notes,
        )


async def serve_until_signal(cfg: Config, *, out: TextIO | None = None) -> RunSummary:
    """Run until SIGINT/SIGTERM, then shut down gracefully (``llmtop run --headless``)."""
    server = LlmtopServer(cfg, out=out)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except OSError as exc:
        await server.stop(0)
        raise StartupError(str(exc)) from exc
    await stop.wait()
    return await server.stop()


class StartupError(RuntimeError):
    """Could not bind an address or reach a required resource at start-up."""
