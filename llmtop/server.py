"""Composition of llmtop processes: proxy → bus → metrics / detectors / recording, plus the
admin API and the GPU and engine samplers.

Three shapes, all wiring the same packages:

* ``LlmtopServer`` with a proxy — one process does everything (``llmtop run --headless``);
* a worker (``serve_worker``) — only the proxy; its events go to a coordinator;
* a coordinator (``serve_coordinator``) — no proxy; it spawns workers on one port and runs
  the observers for all of them (see :mod:`llmtop.workers`).

The forwarding path (``llmtop.proxy``) only publishes events to the bus; every observer
runs on the other side of ``EventBus.drain``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import socket
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from aiohttp import web

from llmtop import __version__, http_errors_log, pipe_out
from llmtop.admin.routes import AdminContext, make_admin_app
from llmtop.bus import PUMP_INTERVAL_S, EventBus
from llmtop.clock import unix_now
from llmtop.config import MB, Config, is_loopback, parse_hostport, slo_dict
from llmtop.engines.scraper import EngineScraper, metrics_url_for
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.fleet_counts import FleetCounts
from llmtop.gpu import open_gpu_source
from llmtop.listen import start_tcp
from llmtop.loopthread import LoopThread
from llmtop.metrics.aggregator import Aggregator
from llmtop.out_of_files_warning import OWN, OutOfFilesSources, OutOfFilesWarning
from llmtop.proxy.relay import SHUTDOWN_REASON
from llmtop.proxy.server import ProxyServer
from llmtop.recording.errors import RecordingError
from llmtop.recording.writer import ORDER_HOLD_S, RecordingController
from llmtop.saturation import SaturationMonitor
from llmtop.stop_signals import stop_signals
from llmtop.ticks import grid_delay
from llmtop.tls import upstream_ssl
from llmtop.worker_procs import StartupErrorProxy, Supervisor, spawn_workers
from llmtop.workers import (
    FORWARD_INTERVAL_S,
    INGEST_PATH,
    EventForwarder,
    FleetActive,
    ingest_route,
)

T = TypeVar("T")

TICK_S = 0.5
"""How often the metrics rotate their intervals; the detectors run every second tick."""

COORDINATOR_ORDER_HOLD_S = FORWARD_INTERVAL_S + 0.25
"""How long the coordinator's recorder holds a line to write it in time order: a worker's
records reach it up to one forwarding interval (and their trip, and the coordinator's loop
on a busy machine) after the requests ended. (The recorder caps the hold at
``writer.HOLD_CAP * flush_s``, for what a kill -9 may lose.)"""


class StartupError(RuntimeError):
    """Could not bind an address or start a part at start-up (exit code 2)."""


@dataclass
class RunSummary:
    """What a headless run prints when it ends."""

    uptime_s: float
    requests: int
    errors: int
    cancelled_at_shutdown: int
    output_tokens: int
    notes: list[str] = field(default_factory=list)
    exit_code: int = 0
    """1 when the run ended by a failure, not a signal (every worker left stopped)."""

    def lines(self) -> list[str]:
        out = [
            f"llmtop: served {_n(self.requests, 'request')} in {self.uptime_s:.1f} s "
            f"({_n(self.errors, 'error')}, {_n(self.output_tokens, 'output token')})",
        ]
        if self.cancelled_at_shutdown:
            n = self.cancelled_at_shutdown
            out.append(
                f"llmtop: {_n(n, 'in-flight stream')} {'was' if n == 1 else 'were'} "
                "cancelled at the shutdown deadline"
            )
        out.extend(self.notes)
        return out


def _recording_failed(path: Path, error: str) -> None:
    """The moment a recording stops writing (the recorder's writer thread): one line on
    stderr, so that a headless proxy's log says when the recording broke, not only its
    summary at exit (and the admin API's recording status, ``error``)."""
    pipe_out.say(f"llmtop: warning: recording {path} stopped writing: {error}; the proxy "
                 "goes on forwarding, the lines from now on are dropped (counted in the "
                 "summary)", sys.stderr)


def _other_writers(stem: str, parts: Sequence[str]) -> None:
    """Another live process is writing this stem (a restart that overlapped the old
    process, or two proxies given one ``--record``): one line on stderr, naming its part.
    The recording starts all the same — a proxy does not fail to start over a recording;
    the old process of an overlapping restart is about to exit — as a series of its own
    beside the other's, and ``keep`` leaves the parts the other is writing."""
    if parts:
        pipe_out.say(f"llmtop: warning: another live process is recording to {stem}: it is "
                     f"writing {', '.join(parts)} (a restart before the old process exited, "
                     "or two proxies given one --record?); this recording goes on beside "
                     "it as a series of its own and keep leaves the parts it is writing; "
                     "give each proxy its own --record", sys.stderr)


def _n(n: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Observers:
    """Everything on the far side of the bus: aggregation, detectors, recording, admin API,
    samplers. Used by the single process and by the coordinator."""

    def __init__(self, cfg: Config, bus: EventBus, active: Mapping[str, ActiveRequest],
                 *, upstream_down: Any = None, out: TextIO | None = None,
                 order_hold_s: float = ORDER_HOLD_S, who: str = "the proxy",
                 open_count: Callable[[], int] | None = None) -> None:
        """``who``: this process in the ``OUT_OF_FILES`` warning (``the proxy``, or ``the
        coordinator``, whose workers' own come through :attr:`out_of_files`).
        ``open_count``: the requests open in the proxy now (every worker's), read when a
        recording stops (its footer's ``open_at_stop``: requests it will never hold)."""
        self.cfg = cfg
        self.bus = bus
        self.active = active
        self.out = out or sys.stdout
        self.started_at = unix_now()
        self.aggregator = Aggregator(cfg, active, upstream=cfg.upstream)
        bus.subscribe(self.aggregator.on_events)
        self.monitor = SaturationMonitor(
            cfg, bus.publish, active, upstream_down=upstream_down or (lambda: False)
        )
        bus.subscribe(self.monitor.on_events)
        self.out_of_files = OutOfFilesSources(bus.publish)
        """The proxy's ``OUT_OF_FILES`` (the coordinator's ingest route adds the workers')."""
        self._own_fds = OutOfFilesWarning(lambda ev: self.out_of_files.saw(OWN, ev), who)
        self.requests = self.errors = self.output_tokens = 0
        bus.subscribe(self._count)
        self.recording = RecordingController(
            bus, header=self._recording_header, queue_max=cfg.recording.queue_max,
            queue_max_chunks=cfg.recording.queue_max_chunks, flush_s=cfg.recording.flush_s,
            order_hold_s=order_hold_s, on_error=_recording_failed,
            rotate_bytes=round(cfg.recording.rotate_mb * MB), rotate_s=cfg.recording.rotate_s,
            keep=cfg.recording.keep, open_count=open_count,
        )
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.tick_errors = 0
        """Errors raised by a part of the observers' tick (see :meth:`_guarded`)."""
        self.last_tick_error: BaseException | None = None
        self._tick_said: set[str] = set()
        self._gpu: Any = None
        self.admin_url = ""

    def _count(self, batch: Sequence[Event]) -> None:
        for ev in batch:
            if isinstance(ev, RequestRecord):
                self.requests += 1
                self.errors += ev.outcome in ("error", "timeout")
                self.output_tokens += ev.completion_tokens or 0

    def _recording_header(self) -> dict[str, Any]:
        return {
            "upstream": self.cfg.upstream,
            "slo": slo_dict(self.cfg),
            "llmtop_version": __version__,
            "workers": self.cfg.workers,
        }

    def say(self, line: str) -> None:
        pipe_out.say(line, self.out)  # (`| head -1`: the reader gone, the proxy goes on)

    async def start_admin(self, extra_routes: list[web.RouteDef] | None = None,
                          self_authenticated: frozenset[str] = frozenset()) -> str:
        ctx = AdminContext(
            aggregator=self.aggregator,
            active=self.active,
            recording=self.recording,
            admin_token=self.cfg.admin_token,
            extra_info={"upstream": self.cfg.upstream, "llmtop_version": __version__},
            self_authenticated=self_authenticated,
        )
        host, port = parse_hostport(self.cfg.admin, "admin")
        ctx.loopback = is_loopback(host)
        app = make_admin_app(ctx)
        if extra_routes:
            app.add_routes(extra_routes)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        http_errors_log.install()  # a malformed request: one line, not a traceback
        try:
            bound = await start_tcp(self._runner, host, port)
        except OSError as exc:
            raise StartupError(f"admin address {self.cfg.admin}: {_why(exc)}") from exc
        shown = f"[{host}]" if ":" in host else host
        self.admin_url = f"http://{shown}:{bound}"
        return self.admin_url

    def check_recording(self) -> None:
        """StartupError when ``--record``'s path would be refused (before anything binds)."""
        if self.cfg.recording.path:
            try:
                self.recording.check(self.cfg.recording.path)
            except RecordingError as exc:
                raise StartupError(str(exc)) from exc

    def open_gpu(self) -> None:
        """Open the GPU source (NVML's start-up, ``--gpus`` checked against the GPUs there
        are): ``ConfigError`` for a source that cannot be had, before anything binds (QA:
        ``--gpu-source nvml`` without NVML printed both listen lines, then exited 2)."""
        if self._gpu is None:
            self._gpu = open_gpu_source(self.cfg, self.bus.publish, upstream=self.cfg.upstream)

    def start_background(self) -> None:
        cfg = self.cfg
        self._tasks.append(asyncio.create_task(self.bus.pump(PUMP_INTERVAL_S), name="bus-pump"))
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="metrics-tick"))
        self.open_gpu()
        gpu = self._gpu
        msg = gpu.start()
        if msg:
            self.say(f"llmtop: {msg}")
        self.aggregator.gpu_status = lambda: str(gpu.status)
        if cfg.engine.enabled and cfg.upstream:
            url = metrics_url_for(cfg.upstream, cfg.engine.metrics_url)
            scraper = EngineScraper(url, None, self.bus.publish, interval_s=cfg.engine.interval_s)
            scraper.ssl = upstream_ssl(cfg)
            self.aggregator.engine_status = lambda: scraper.status
            self._tasks.append(asyncio.create_task(scraper.run(), name="engine-scraper"))
        if cfg.recording.path:
            try:
                st = self.recording.start(cfg.recording.path)
            except RecordingError as exc:
                raise StartupError(str(exc)) from exc
            if st.get("part"):
                _other_writers(cfg.recording.path, st.get("others_writing") or [])
                gone = st.get("deleted_earlier") or 0
                left = st.get("left_held_at_start") or 0
                kept = ([f"deleted the oldest {'part' if gone == 1 else f'{gone} parts'} an "
                         "earlier run left"] if gone else []) + (
                    [f"left {_n(left, 'part')} another live process is writing"]
                    if left else [])
                self.say(f"llmtop: recording to {cfg.recording.path} in parts, the first "
                         f"{st['path']}"
                         + (f" (keep {cfg.recording.keep}: {'; '.join(kept)})"
                            if kept else ""))
            else:
                self.say(f"llmtop: recording to {cfg.recording.path}")

    async def _tick_loop(self, tick_s: float = TICK_S) -> None:
        """Rotate metric intervals twice a second; evaluate the detectors once a second
        (on the loop's shared grid: the bus pump wakes at the same instants), and say so
        when this process has no file descriptor left (clients it cannot accept are
        dropped by the event loop unseen: :mod:`llmtop.out_of_files`), on the output and
        in the ``OUT_OF_FILES`` warning (:mod:`llmtop.out_of_files_warning`)."""
        n = 0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(grid_delay(loop.time(), tick_s))
            self._guarded("metrics", self.aggregator.tick)
            n += 1
            if n % 2 == 0:
                self._guarded("warnings", self.monitor.tick)
                self._guarded("open files", self._own_fds.tick)
                self._guarded("open files", self.out_of_files.prune)

    def _guarded(self, what: str, tick: Callable[[], object]) -> None:
        """One part of a tick; an error it raises is counted (:attr:`tick_errors`), said
        once per part, and the ticks go on. Unguarded, one error ended the task for good:
        no window rotated and no warning was judged again, and the detectors' deques of
        finished requests, trimmed by their tick, grew with every request (the memory
        soak: 55k requests held, RSS 60 -> 142 MB in 10 minutes)."""
        try:
            tick()
        except Exception as exc:  # a bug in one observer must not stop the others' ticks
            self.tick_errors += 1
            self.last_tick_error = exc
            if what not in self._tick_said:
                self._tick_said.add(what)
                self.say(f"llmtop: internal error in the {what} tick (carrying on; said "
                         f"once): {type(exc).__name__}: {exc}")

    async def stop(self, cancelled_at_shutdown: int = 0) -> RunSummary:
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
        if self.recording.status() is not None:
            done = self.recording.stop()
            n, keep = done.get("part") or 0, self.recording.keep
            # (with keep, the parts this run made are its newest: those past keep are gone,
            # and their requests with them — "in 37 parts: 8265 requests" alone promised
            # all of it to whoever then reads the stem)
            gone = (f"; the oldest{'' if n - keep == 1 else f' {n - keep}'} deleted by keep "
                    f"{keep}" if keep and n > keep else "")
            # (and an earlier run's parts that keep deleted as this run's took their place:
            # the start line counted only those deleted when the first part opened)
            later = (done.get("deleted_earlier") or 0) - (done.get("deleted_earlier_at_start")
                                                          or 0)
            if later > 0:
                gone += (f", with {_n(later, 'more part')} an earlier run left" if gone else
                         f"; keep {keep} deleted {_n(later, 'more part')} an earlier run left")
            left = done.get("left_held") or 0
            if left:  # (another live process was writing them: two recorders on one stem)
                gone += (f"; keep {keep} left {_n(left, 'part')} another live process was "
                         "writing")
            parts = (f" in {_n(n, 'part')} (the last {done.get('path')}{gone})" if n else "")
            notes.append(
                f"llmtop: recording {done.get('stem') or done.get('path')}{parts}: "
                + (f"at least {done.get('requests', 0)} requests, up to "
                   f"{done['unsure_requests']} more in the file's last lines"
                   if done.get("unsure_requests") else f"{done.get('requests', 0)} requests")
                + (f", {done['dropped']} lines dropped" if done.get("dropped") else "")
                + (f", {_n(done['open_at_stop'], 'request')} still open at the stop (not in "
                   "it)" if done.get("open_at_stop") else "")
                # (a failed write or flush: the counts were settled against the file; other
                # failures — the file gone, a close — may leave it holding fewer)
                + (f"; it stopped writing: {done['error']}"
                   + ("" if done.get("counts_settled") else " (the file may hold fewer)")
                   if done.get("error") else "")
            )
        if self._runner is not None:
            await self._runner.cleanup()
        return RunSummary(
            uptime_s=unix_now() - self.started_at,
            requests=self.requests,
            errors=self.errors,
            cancelled_at_shutdown=cancelled_at_shutdown,
            output_tokens=self.output_tokens,
            notes=notes,
        )


class LlmtopServer:
    """One process: the proxy and its observers. ``start()`` binds both addresses and
    prints them; ``stop()`` shuts down gracefully.

    The proxy runs on the caller's event loop; the observers (``Observers``: aggregation,
    detectors, recording, samplers, the admin API) run on a loop of their own in a second
    thread (:class:`llmtop.loopthread.LoopThread`), so nothing they do is ever queued in
    front of a chunk."""

    def __init__(self, cfg: Config, *, out: TextIO | None = None) -> None:
        self.cfg = cfg
        self.bus = EventBus()
        self.active: dict[str, ActiveRequest] = {}
        self.proxy = ProxyServer(cfg, self.bus, self.active)
        # (the requests open that will have a record: the registry the proxy keeps them in
        # — proxy.in_flight counts the unmeasured ones too, such as GET /v1/models, and
        # walks a set the proxy's loop changes; len() of a dict reads safely from here)
        self.observers = Observers(cfg, self.bus, self.active,
                                   upstream_down=lambda: self.proxy.upstream_down, out=out,
                                   open_count=self.active.__len__)
        self.aggregator = self.observers.aggregator
        self.recording = self.observers.recording
        self.monitor = self.observers.monitor
        self.proxy_url = ""
        self.admin_url = ""
        self._observer_loop: LoopThread | None = None

    async def _on_observers(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` where the observers live (their thread, from ``start()`` on)."""
        if self._observer_loop is None:  # stop() without start()
            return await coro
        return await self._observer_loop.call(coro)

    async def start(self) -> None:
        """Check ``--record``, bind the admin API, then the proxy; only then say so (scripts
        wait for the listen lines: once printed, nothing left can refuse to start) and
        start the background work, the recording included."""
        self.observers.check_recording()
        self.observers.open_gpu()
        low = raise_open_files()
        self._observer_loop = LoopThread()
        self.admin_url = await self._on_observers(self.observers.start_admin())
        try:
            self.proxy_url = await self.proxy.start()
        except OSError as exc:
            raise StartupError(f"listen address {self.cfg.listen}: {_why(exc)}") from exc
        self.observers.say(f"llmtop: proxy listening on {self.proxy_url}")
        self.observers.say(f"llmtop: admin listening on {self.admin_url}")
        if low:
            self.observers.say(low)
        await self._on_observers(_call(self.observers.start_background))

    async def stop(self, grace_s: float | None = None) -> RunSummary:
        summary = await self.proxy.shutdown(grace_s)
        try:
            return await self._on_observers(self.observers.stop(summary.cancelled))
        finally:
            if self._observer_loop is not None:
                self._observer_loop.close()
                self._observer_loop = None


async def _call(fn: Callable[[], None]) -> None:
    fn()


def _tune_process() -> None:
    """Process settings for a long-running proxy: hand the GIL over every 0.5 ms (not
    Python's default 5 ms) so the observers' thread or a sampler parsing an engine's
    /metrics never stalls the forwarding path by more than that; and move the objects of
    start-up out of the garbage collector's generations (``gc.freeze``) so its collections
    only walk what serving allocates. (Raising the collector's thresholds to (30000, 50, 20)
    made full collections rare in the soak, but young ones of 10-80 ms; at 256 paced streams
    the defaults gave the better added latency: TTFT p99 81 vs 114 ms, chunk p99 26 vs 36.)"""
    sys.setswitchinterval(0.0005)
    gc.collect()
    gc.freeze()


OPEN_FILES_WANTED = 65536
"""The open-file limit llmtop raises its soft limit to (each stream holds two sockets)."""


def raise_open_files(wanted: int = OPEN_FILES_WANTED) -> str | None:
    """Raise the soft ``RLIMIT_NOFILE`` towards ``wanted`` (as far as the hard limit
    allows): the usual default of 1,024 would refuse connections past ~500 streams.
    Returns a line to print when the limit stays below a few thousand, else None."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux/macOS
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (ValueError, OSError):
        return None
    if soft != resource.RLIM_INFINITY and soft < 4096:
        # two sockets a stream, after what the process holds besides (its listeners,
        # libraries, a recording: about 64, fewer under a small limit — at 64 about 20
        # streams fit, where "(64 - 64) // 2" said 1)
        streams = max(1, (soft - min(64, soft // 4)) // 2)
        return (f"llmtop: at most {soft} open files (ulimit -n, hard limit {hard}): "
                f"about {streams} stream{'s' if streams != 1 else ''} at once")
    return None


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():  # (SIGHUP too: the ssh session or terminal closed)
        with contextlib.suppress(RuntimeError):  # not the main thread (tests): no signals
            loop.add_signal_handler(sig, stop.set)
    return stop


def _why(exc: OSError) -> str:
    """A bind error in the system's words ("Address already in use"), not asyncio's
    wrapper ("error while attempting to bind on address (...)"); a host name that does not
    resolve says so (its errno is a resolver code: os.strerror read "Unknown error -2")."""
    if isinstance(exc, socket.gaierror):
        return f"host not found ({exc.strerror})"
    return os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))


def _on_next_signal(fn: Callable[[], None]) -> None:
    """After the first SIGINT/SIGTERM: what another one does (the usual "press Ctrl-C again
    to stop now")."""
    loop = asyncio.get_running_loop()
    for sig in stop_signals():
        with contextlib.suppress(RuntimeError):  # not the main thread (tests): no signals
            loop.add_signal_handler(sig, fn)


def _hurry(proxy: ProxyServer, say: Callable[[str], None]) -> Callable[[], None]:
    def hurry() -> None:
        say("llmtop: stopping now: the requests still in flight are cancelled")
        proxy.hurry()
    return hurry


async def serve_until_signal(cfg: Config, *, out: TextIO | None = None) -> RunSummary:
    """Run until SIGINT/SIGTERM, then shut down gracefully (``llmtop run --headless``)."""
    stop = _stop_event()
    server = LlmtopServer(cfg, out=out)
    try:
        await server.start()
    except StartupError:
        with contextlib.suppress(Exception):
            await server.stop(0)
        raise
    _tune_process()
    await stop.wait()
    _on_next_signal(_hurry(server.proxy, server.observers.say))
    if server.proxy.in_flight:
        server.observers.say(
            f"llmtop: stopping: {server.proxy.in_flight} request(s) in flight may finish "
            f"within {cfg.timeouts.shutdown_grace_s:g} s (signal again to stop now)")
    return await server.stop()


async def serve_worker(cfg: Config, index: int, ingest_url: str, token: str,
                       fleet_path: str | None = None) -> None:
    """One of N proxy processes: proxy only, events forwarded to the coordinator.
    ``fleet_path``: the coordinator's table of open requests per worker (the worker's
    records then count every worker's open requests in ``concurrency_at_start``)."""
    stop = _stop_event()
    bus = EventBus()
    active: dict[str, ActiveRequest] = {}
    proxy = ProxyServer(cfg, bus, active)
    if fleet_path:
        try:
            proxy.fleet = FleetCounts.attach(fleet_path, index)
        except (OSError, ValueError) as exc:
            raise StartupError(f"the workers' shared table {fleet_path}: {exc}") from exc
    raise_open_files()  # the coordinator says so when the limit stays low
    forwarder = EventForwarder(ingest_url, token, index, active, table=proxy.fleet)
    bus.subscribe(forwarder.on_events)
    try:
        await proxy.start(reuse_port=True)
    except OSError as exc:
        raise StartupError(f"listen address {cfg.listen}: {_why(exc)}") from exc
    try:
        print(f"llmtop: worker ready {index}", flush=True)
    except BrokenPipeError:  # the coordinator gave up waiting (or is gone): so do we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        await proxy.shutdown()
        return
    _tune_process()
    task = asyncio.create_task(forwarder.run(bus))
    await stop.wait()
    _on_next_signal(proxy.hurry)  # the coordinator passes a second signal on
    await proxy.shutdown()
    if proxy.fleet is not None:
        proxy.fleet.set_mine(0)  # gone: the other workers no longer count its requests
        proxy.fleet.close()
        proxy.fleet = None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def serve_coordinator(cfg: Config, *, config_path: str | None = None,
                            out: TextIO | None = None) -> RunSummary:
    """``llmtop run --workers N --headless`` (or ``--split-observers``, N = 1): spawn N
    workers, observe them as one proxy."""
    stop = _stop_event()
    bus = EventBus()
    fleet = FleetActive()
    # the workers' records come every FORWARD_INTERVAL_S: held that much longer, the
    # recording's lines are written in time order (writer.ORDER_HOLD_S)
    obs = Observers(cfg, bus, fleet, out=out, order_hold_s=COORDINATOR_ORDER_HOLD_S,
                    who="the coordinator")
    obs.out_of_files.live = fleet.serving
    token = secrets.token_hex(16)
    obs.check_recording()
    obs.open_gpu()
    if not cfg.user_salt:  # every worker must derive the same key pseudonyms
        from llmtop.proxy.identity import stored_salt

        salt = stored_salt()  # the same as one process would use
        os.environ["LLMTOP_USER_SALT"] = salt.decode() if salt else secrets.token_hex(16)
    admin_url = await obs.start_admin([ingest_route(bus, fleet, token,
                                                    out_of_files=obs.out_of_files)],
                                      self_authenticated=frozenset({INGEST_PATH}))
    try:
        counts, counts_path = FleetCounts.create(cfg.workers)
    except OSError as exc:
        await obs.stop()
        raise StartupError(f"cannot create the workers' shared table: {exc}") from exc
    obs.recording.open_count = counts.others  # (slot -1: every worker's open requests)
    try:  # the workers map it through this descriptor: the name can go at once
        counts_fd = os.open(counts_path, os.O_RDWR)
    except OSError as exc:
        counts.close()
        await obs.stop()
        raise StartupError(f"cannot open the workers' shared table: {exc}") from exc
    finally:
        os.unlink(counts_path)
    try:
        procs, proxy_url, launcher = await spawn_workers(
            cfg, admin_url + "/llmtop/v1/_ingest", token, config_path, counts_fd)
    except (StartupErrorProxy, OSError, TimeoutError) as exc:
        os.close(counts_fd)
        counts.close()
        await obs.stop()
        raise StartupError(str(exc)) from exc
    obs.say(f"llmtop: proxy listening on {proxy_url}")
    obs.say(f"llmtop: admin listening on {admin_url}")
    obs.say(f"llmtop: {len(procs)} workers sharing the port" if len(procs) > 1 else
            "llmtop: 1 worker proxying; the observers in a process of their own")
    low = raise_open_files()  # (each worker raises its own; the limits are alike)
    if low:
        obs.say(low)
    supervisor = Supervisor(launcher, procs, counts, fleet, obs.say, publish=bus.publish)
    watching = asyncio.create_task(supervisor.run())
    obs.start_background()
    _tune_process()
    signalled = asyncio.ensure_future(stop.wait())
    # the supervisor's watch ends by itself only when every worker is left stopped: the
    # port serves nobody, for good — stop, and exit 1, so a service manager restarts the
    # whole proxy (before, it ran on, connections refused, and exited 0 at a signal)
    await asyncio.wait({signalled, watching}, return_when=asyncio.FIRST_COMPLETED)
    no_workers = (watching.done() and not stop.is_set() and not watching.cancelled()
                  and watching.exception() is None)  # (an error in it: raised below)
    signalled.cancel()
    if no_workers:
        obs.say(f"llmtop: error: no worker left serving ({len(supervisor.given_up)} of "
                f"{len(supervisor.procs)} left stopped; the lines above say why): stopping")
    _on_next_signal(lambda: supervisor.hurry(obs.say))
    open_now = counts.others()  # every worker's open requests, from the shared table
    if open_now:
        obs.say(f"llmtop: stopping: {open_now} request(s) in flight may finish within "
                f"{cfg.timeouts.shutdown_grace_s:g} s (signal again to stop now)")
    cut: list[int] = [0]  # streams the workers cancelled at their shutdown deadline

    def count_cut(events: Sequence[Event]) -> None:
        cut[0] += sum(1 for e in events if isinstance(e, RequestRecord)
                      and e.outcome == "cancelled" and e.error == SHUTDOWN_REASON)

    bus.subscribe(count_cut)
    await supervisor.stop_all(watching, cfg.timeouts.shutdown_grace_s)
    # (the workers are gone: what they had open either ended in the grace or was cut at
    # its deadline and recorded cancelled; a killed one's slot was cleared, its loss
    # counted apart — read the table before it closes)
    still_open = counts.others()
    obs.recording.open_count = lambda: still_open
    os.close(counts_fd)
    counts.close()
    await asyncio.sleep(0.1)
    bus.drain()  # the workers' last records, which count_cut reads, before cut[0] is read
    summary = await obs.stop(cut[0])
    if supervisor.restarts or supervisor.given_up:
        summary.notes.append(
            f"llmtop: {supervisor.restarts} worker "
            f"restart{'' if supervisor.restarts == 1 else 's'}"
            + (f"; not running at the end: {', '.join(map(str, sorted(supervisor.given_up)))}"
               if supervisor.given_up else ""))
    if no_workers:
        summary.exit_code = 1
    return summary
