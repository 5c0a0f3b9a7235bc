"""``llmtop run --workers N``: N proxy processes sharing the listen port (``SO_REUSEPORT``),
one coordinator that sees them as one proxy.

Design (one writer, one aggregation): each worker only proxies. Its bus has one subscriber,
an :class:`EventForwarder` that batches finished-request events and a copy of its open
requests and POSTs them to the coordinator over loopback every ``interval_s`` — off the
forwarding path, like every other observer. The coordinator feeds those events into the
ordinary pipeline: one Aggregator (so snapshots, percentiles and ``/metrics`` are exact by
construction — the same histograms one process would have built), one SaturationMonitor,
one Recorder (so a recording from N workers is a single file with no interleaving), and the
GPU and engine samplers. Its admin API is the usual one plus a private ingest route guarded
by a random token.

``perf_counter_ns`` is CLOCK_MONOTONIC on Linux — one clock for every process on the
machine — so the workers' open-request timestamps compare directly with the coordinator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import operator
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from llmtop.bus import EventBus
from llmtop.config import Config, parse_hostport
from llmtop.events import (
    ActiveRequest,
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    WarningEvent,
)

INGEST_PATH = "/llmtop/v1/_ingest"
ACTIVE_FIELDS = tuple(f.name for f in dataclasses.fields(ActiveRequest))
ACTIVE_ROW = operator.attrgetter(*ACTIVE_FIELDS)
"""An open request as a tuple of its fields (a fifth of ``dataclasses.asdict``'s cost,
which recursed and deep-copied; a worker ships every open request five times a second)."""
TOKEN_HEADER = "X-LLMTOP-Ingest-Token"


def event_from_json(d: Mapping[str, Any]) -> Event | None:
    kind = d.get("type")
    if kind == "request":
        return RequestRecord.from_json_dict(dict(d))
    if kind == "gpu":
        return GpuReading.from_json_dict(dict(d))
    if kind == "engine":
        return EngineReading.from_json_dict(dict(d))
    if kind == "warning":
        return WarningEvent.from_json_dict(dict(d))
    return None


class EventForwarder:
    """Worker side: a bus subscriber that ships events and open requests to the coordinator."""

    def __init__(self, url: str, token: str, worker: int, active: Mapping[str, ActiveRequest],
                 *, interval_s: float = 0.2, max_buffer: int = 200_000,
                 on_fleet: Callable[[int], None] | None = None) -> None:
        self.url = url
        self.token = token
        self.worker = worker
        self.active = active
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.buffer: list[dict[str, Any]] = []
        self.dropped = 0
        self.fleet_in_flight = 0
        """Open requests across all workers, as the coordinator last reported."""
        self.on_fleet = on_fleet
        """Called with the open requests of the *other* workers after each report."""

    def on_events(self, batch: Sequence[Event]) -> None:
        room = self.max_buffer - len(self.buffer)
        if room < len(batch):
            self.dropped += len(batch) - max(room, 0)
            batch = list(batch)[: max(room, 0)]
        self.buffer.extend(ev.to_json_dict() for ev in batch)

    def payload(self) -> bytes:
        events, self.buffer = self.buffer, []
        row = ACTIVE_ROW
        active = [row(a) for a in list(self.active.values())]
        return json.dumps({"worker": self.worker, "events": events, "active": active,
                           "dropped": self.dropped}).encode()

    async def run(self, bus: EventBus) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            try:
                while True:
                    await asyncio.sleep(self.interval_s)
                    bus.drain()
                    await self._post(session)
            finally:
                bus.drain()
                with contextlib.suppress(Exception):
                    await self._post(session)

    async def _post(self, session: aiohttp.ClientSession) -> None:
        body = self.payload()
        try:
            async with session.post(self.url, data=body,
                                    headers={TOKEN_HEADER: self.token}) as resp:
                if resp.status == 200:
                    reply = await resp.json()
                    self.fleet_in_flight = int(reply.get("in_flight", 0))
                    if self.on_fleet is not None:
                        mine = int(reply.get("worker_in_flight", 0))
                        self.on_fleet(max(0, self.fleet_in_flight - mine))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            # the coordinator is gone or busy: keep the events for the next try (bounded)
            old = json.loads(body)["events"]
            self.buffer[:0] = old[: self.max_buffer]


class FleetActive(Mapping[str, ActiveRequest]):
    """Coordinator side: the union of every worker's open requests, read-only."""

    def __init__(self) -> None:
        self.by_worker: dict[int, dict[str, ActiveRequest]] = {}

    def update(self, worker: int, rows: list[list[Any]]) -> None:
        """``rows``: each open request as the values of ``ACTIVE_FIELDS``, in order."""
        made = [ActiveRequest(*r) for r in rows]
        self.by_worker[worker] = {a.id: a for a in made}

    def drop(self, worker: int) -> None:
        self.by_worker.pop(worker, None)

    def __getitem__(self, key: str) -> ActiveRequest:
        for rows in self.by_worker.values():
            if key in rows:
                return rows[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        for rows in list(self.by_worker.values()):
            yield from list(rows)

    def __len__(self) -> int:
        return sum(len(r) for r in self.by_worker.values())


def ingest_route(bus: EventBus, fleet: FleetActive, token: str) -> web.RouteDef:
    async def ingest(request: web.Request) -> web.Response:
        if not secrets.compare_digest(request.headers.get(TOKEN_HEADER, ""), token):
            return web.json_response({"error": "forbidden"}, status=403)
        try:
            body = await request.json()
            worker = int(body["worker"])
            for d in body.get("events", []):
                ev = event_from_json(d)
                if ev is not None:
                    bus.publish(ev)
            fleet.update(worker, list(body.get("active", [])))
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"bad ingest payload: {exc}"}, status=400)
        return web.json_response({"in_flight": len(fleet),
                                  "worker_in_flight": len(fleet.by_worker.get(worker, {}))})

    return web.post(INGEST_PATH, ingest)


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) a SO_REUSEPORT socket so every worker gets the same port
    even when the user asked for port 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    return s


def run_workers(cfg: Config, config_path: str | None = None) -> int:
    """The coordinator of ``llmtop run --workers N --headless`` (blocks until a signal)."""
    from llmtop.server import StartupError, serve_coordinator

    try:
        summary = asyncio.run(serve_coordinator(cfg, config_path=config_path))
    except StartupError as exc:
        print(f"llmtop run: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for line in summary.lines():
        print(line, flush=True)
    return 0


async def spawn_workers(cfg: Config, ingest_url: str, token: str, config_path: str | None,
                        ) -> tuple[list[asyncio.subprocess.Process], str]:
    """Start ``cfg.workers`` proxy processes on one port; returns them and the proxy URL."""
    host, port = parse_hostport(cfg.listen, "listen")
    holder = reserve_port(host, port)
    port = holder.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i in range(cfg.workers):
            cmd = [sys.executable, "-m", "llmtop", "_worker", "--index", str(i),
                   "--listen", f"{shown}:{port}", "--upstream", cfg.upstream,
                   "--ingest", ingest_url]
            if config_path:
                cmd += ["--config", config_path]
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(token.encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line.startswith(b"llmtop: worker ready"):
                raise StartupErrorProxy(
                    f"worker {i} did not start: {line.decode(errors='replace').strip()}")
            procs.append(proc)
    except BaseException:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        holder.close()
        raise
    holder.close()
    return procs, f"http://{shown}:{port}"


class StartupErrorProxy(RuntimeError):
    """A worker failed to start (mapped to StartupError by the coordinator)."""


async def stop_workers(procs: list[asyncio.subprocess.Process], grace_s: float) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 10
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
