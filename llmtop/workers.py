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

The ingest wire format (what a POST carries, and how the coordinator checks it) is in
:mod:`llmtop.workers_wire`.

``perf_counter_ns`` is CLOCK_MONOTONIC on Linux — one clock for every process on the
machine — so the workers' open-request timestamps compare directly with the coordinator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, ValuesView
from itertools import chain
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from llmtop import pipe_out
from llmtop.bus import EventBus
from llmtop.clock import unix_now
from llmtop.config import Config, max_workers
from llmtop.events import ActiveRequest, ChunkSlice, Event, RequestRecord, WarningEvent
from llmtop.fleet_counts import FleetCounts
from llmtop.out_of_files_warning import CODE as OUT_OF_FILES
from llmtop.out_of_files_warning import OutOfFilesSources, OutOfFilesWarning
from llmtop.workers_wire import (
    BATCH_CHUNKS,
    BATCH_EVENTS,
    MAX_BODY,
    TOKEN_HEADER,
    IngestError,
    decode_batch,
    encode_batch,
)
from llmtop.workers_wire import (
    INGEST_PATH as INGEST_PATH,  # re-exported: the coordinator (llmtop.server) uses it
)

FORWARD_INTERVAL_S = 0.5
"""How often a worker ships its finished requests and open ones to the coordinator. Each
POST costs both sides about a millisecond of CPU whatever it carries: at 0.2 s the
coordinator's CPU per forwarded chunk was ~25% higher and the whole tree's ~5% (64
streams). Nothing it carries needs more: the screens accept snapshots 0.5 s old, and
records count the other workers' open requests from :mod:`llmtop.fleet_counts`, not from
these reports."""


class IngestClient:
    """One keep-alive HTTP/1.1 connection to the coordinator's ingest route.

    aiohttp's client cost a worker about 0.4 ms of CPU per POST on this 2-core machine
    (request and response objects, timers, cookie jar), two POSTs a second; this writes the
    request head by hand and reads the small reply (status line, ``Content-Length``, body).
    Any failure closes the connection; the next POST opens a new one."""

    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname or u.port is None:
            raise ValueError(f"ingest URL must be http://HOST:PORT/PATH, not {url!r}")
        self.host, self.port = u.hostname, u.port
        self.timeout_s = timeout_s
        self._head = (f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                      f"{TOKEN_HEADER}: {token}\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: ").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; the reply's status and body. OSError (ConnectionError) or
        TimeoutError when the coordinator cannot be reached or answers nonsense."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._exchange(body)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise ConnectionError(f"bad reply from the coordinator: {exc!r}") from None
        except BaseException:
            self.close()
            raise

    async def _exchange(self, body: bytes) -> tuple[int, bytes]:
        if self._writer is None or self._reader is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        writer.write(b"%s%d\r\n\r\n" % (self._head, len(body)))
        writer.write(body)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, _, rest = head[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(head[0][:80])
        status = int(rest[:3])
        length: int | None = None
        close = version == "HTTP/1.0"
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection":
                close = "close" in value.lower()
            elif name == "transfer-encoding":
                raise ValueError("a chunked reply")
        if length is None:
            raise ValueError("a reply without Content-Length")
        data = await reader.readexactly(length)
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def next_due(due: float, interval_s: float, now: float) -> float:
    """When the next POST goes: on a fixed cadence from the last one's due time, not an
    interval after the last one's answer, so a record waits in the worker at most one
    interval however long the coordinator took to answer (and reaches the coordinator's
    recorder within its hold: ``llmtop.server.COORDINATOR_ORDER_HOLD_S``). Past due (the
    last POST, or a stall, took longer than an interval): now, and the cadence starts
    again from there (one POST, not a burst to catch up)."""
    due += interval_s
    return max(due, now)


SENDER_ENV = "LLMTOP_WORKER_SENDER"
"""The environment variable that names a worker process's sender (its id in every POST),
set by the coordinator's launcher (:class:`~llmtop.worker_procs.WorkerLauncher`): the
coordinator knows it from the start, not only from the process's first report — a process
killed before the coordinator read any report of it is retired all the same, and its first
POST, read after its death was seen, counts nothing twice (:meth:`FleetActive.retire`).
A worker started otherwise names its own."""


class EventForwarder:
    """Worker side: a bus subscriber that ships events and open requests to the coordinator."""

    def __init__(self, url: str, token: str, worker: int, active: Mapping[str, ActiveRequest],
                 *, interval_s: float = FORWARD_INTERVAL_S, max_buffer: int = 200_000,
                 table: FleetCounts | None = None) -> None:
        """``table``: the shared table this worker attached to, where the records it gives
        up leave its running total of requests opened (None: not a worker of one)."""
        self.client = IngestClient(url, token)
        self.table = table
        self.worker = worker
        self.sender = os.environ.get(SENDER_ENV) or secrets.token_hex(8)
        self.seq = 0
        self.active = active
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.buffer: list[Event] = []
        """Events not yet sent, oldest first (records are immutable: kept as they are and
        encoded only when a POST goes out)."""
        self.pending: tuple[list[Event], bytes] | None = None
        """A POST that got no answer: sent again, as it was, before anything else (the
        coordinator takes each ``seq`` once)."""
        self.dropped = 0
        """Events given up: the buffer was full, or the coordinator refused them (4xx)."""
        self.fleet_in_flight = 0
        """Open requests across all workers, as the coordinator last reported (records
        count them exactly: :mod:`llmtop.fleet_counts`)."""

    def on_events(self, batch: Sequence[Event]) -> None:
        room = self.max_buffer - len(self.buffer)
        if room < len(batch):
            self.dropped += len(batch) - max(room, 0)
            batch = list(batch)
            self._gave_up(batch[max(room, 0):])
            batch = batch[: max(room, 0)]
        self.buffer.extend(batch)

    def _gave_up(self, events: Sequence[Event]) -> None:
        """``events`` are given up (counted in ``dropped``): the records among them leave
        the shared table's count of requests this process opened, which a death would
        otherwise count again (:meth:`~llmtop.fleet_counts.FleetCounts.gave_up`)."""
        table = self.table
        if table is not None:
            table.gave_up(sum(1 for ev in events if type(ev) is RequestRecord))

    def take(self) -> list[Event]:
        """The events of the next POST, taken off the front of the buffer (at most
        ``BATCH_EVENTS`` events; records until their chunks reach ``BATCH_CHUNKS``)."""
        buf = self.buffer
        limit = min(len(buf), BATCH_EVENTS)
        n = chunks = 0
        while n < limit and chunks < BATCH_CHUNKS:
            ev = buf[n]
            if type(ev) is RequestRecord:
                chunks += len(ev.chunk_offsets_s)
            elif type(ev) is ChunkSlice:
                chunks += len(ev.offsets_ns)
            n += 1
        taken = buf[:n]
        del buf[:n]
        return taken

    def next_post(self) -> tuple[list[Event], bytes]:
        """The pending POST if there is one, else the next events and the open requests,
        encoded with the next ``seq``."""
        if self.pending is None:
            events = self.take()
            self.seq += 1
            self.pending = (events, encode_batch(
                self.worker, self.dropped, events, list(self.active.values()),
                sender=self.sender, seq=self.seq))
        return self.pending

    async def run(self, bus: EventBus) -> None:
        # this worker's clients it cannot accept: said on its output, and as OUT_OF_FILES
        # on its bus, which this very loop ships to the coordinator (the screens see it)
        fds = OutOfFilesWarning(bus.publish, f"worker {self.worker}")
        loop = asyncio.get_running_loop()
        due = loop.time()
        try:
            while True:
                due = next_due(due, self.interval_s, loop.time())
                await asyncio.sleep(max(0.0, due - loop.time()))
                fds.tick()
                bus.drain()
                while await self.post() and self.buffer:
                    pass  # a backlog: the rest in further POSTs, now
        finally:
            bus.drain()
            with contextlib.suppress(Exception):
                while await self.post() and (self.buffer or self.pending):
                    pass
            self.client.close()

    async def post(self) -> bool:
        """One POST (the pending one again, or the next); True when the coordinator took it.
        Unanswered, it stays pending; refused (4xx: bad token or payload), its events are
        counted in ``dropped`` (sending them again would not help)."""
        events, body = self.next_post()
        try:
            status, reply = await self.client.post(body)
        except (OSError, TimeoutError):
            return False  # the coordinator is gone or busy: the same POST next time
        if status >= 500:
            return False
        self.pending = None
        if status != 200:
            self.dropped += len(events)
            self._gave_up(events)
            return False
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            self.fleet_in_flight = int(json.loads(reply).get("in_flight", 0))
        return True


SENDERS_KEPT = max(256, 4 * max_workers())
"""Worker processes (senders) whose bookkeeping the coordinator keeps — the last POST taken,
the events given up, that it was retired — newest first; older ones are forgotten. A worker
restarted every few minutes for weeks is thousands of processes, each one entry for good;
the live ones (at most :func:`~llmtop.config.max_workers`) post all the time and stay among
the newest, and a dead process's last POST comes seconds after its death, not hundreds of
processes later."""


LOST_IDS_KEPT = 16
"""Retired worker processes whose lost requests' ids the coordinator keeps (a dead
process's last report comes seconds after its death, not 16 deaths later; each set can
hold thousands of ids)."""


def _keep_newest(seen: dict[str, Any], sender: str, value: Any,
                 kept: int = SENDERS_KEPT) -> None:
    """Set ``seen[sender]`` as its newest entry, forgetting the oldest past ``kept``."""
    seen.pop(sender, None)
    seen[sender] = value
    if len(seen) > kept:
        del seen[next(iter(seen))]


class FleetActive(Mapping[str, ActiveRequest]):
    """Coordinator side: the union of every worker's open requests, read-only."""

    def __init__(self) -> None:
        self.by_worker: dict[int, dict[str, ActiveRequest]] = {}
        self._sender: dict[int, str] = {}
        self._retired: dict[str, None] = {}
        """Senders :meth:`drop` retired, the newest :data:`SENDERS_KEPT`."""
        self._lost_ids: dict[str, frozenset[str]] = {}
        """The ids of the open requests :meth:`drop` returned (counted lost), for the
        newest :data:`LOST_IDS_KEPT` retired senders."""
        self._taken: dict[str, int] = {}
        """Per worker process (sender), the newest :data:`SENDERS_KEPT`: the finished
        requests' records the coordinator took from it (:meth:`took`)."""
        self._late: dict[str, int] = {}
        """Per retired sender (the newest :data:`LOST_IDS_KEPT`): how many of the requests
        :meth:`retire` counted unreported may still arrive as records in its last POST,
        read after its death was seen (they are counted already: not published again)."""
        self.lost_events: LostEvents | None = None
        """The ``EVENTS_LOST`` bookkeeping of the ingest route (:func:`ingest_route` sets
        it), where the supervisor adds a killed worker's unreported requests."""
        self.heard: dict[int, float] = {}
        """Per worker: when its last report came (``time.monotonic``); the supervisor
        tells a worker that stopped reporting (a stuck process) from one that exited."""
        self._lock = threading.Lock()  # the ingest route's loop and the supervisor's

    def update(self, worker: int, active: Sequence[ActiveRequest], sender: str = "") -> None:
        """``active``: every open request of ``worker`` now (replaces its previous set).
        ``sender``: the worker process's id; one :meth:`drop` retired is not heard again
        (its last report can arrive after its death was seen)."""
        rows = {a.id: a for a in active}
        with self._lock:
            if sender and sender in self._retired:
                return
            self._set(worker, rows, sender)

    def _set(self, worker: int, rows: dict[str, ActiveRequest], sender: str) -> None:
        if sender:
            self._sender[worker] = sender
        self.by_worker[worker] = rows
        self.heard[worker] = time.monotonic()

    def took(self, sender: str, records: int, worker: int | None = None,
             active: Sequence[ActiveRequest] | None = None) -> bool:
        """``records`` finished requests' records came from ``sender`` and are about to be
        published: counted (True), unless the process is retired (False: its late records
        are sorted by :meth:`counted_lost` and :meth:`late_record`). One lock with
        :meth:`retire`: a record is either among those taken or among those counted lost.
        ``worker``/``active``: the same POST's open requests, taken in the same step
        (:meth:`update`): a death seen between the two (the supervisor runs on another
        thread) would find the records counted and the previous report's open requests,
        which may list some of them — counted once as they ended, once as lost — and not
        the ones opened since (counted nowhere)."""
        rows = None if active is None else {a.id: a for a in active}
        with self._lock:
            if sender in self._retired:
                return False
            if sender:
                _keep_newest(self._taken, sender, self._taken.get(sender, 0) + records)
            if worker is not None and rows is not None:
                self._set(worker, rows, sender)
            return True

    def late_record(self, sender: str) -> bool:
        """A record of retired ``sender`` not among its last report's open requests came
        late: True when it is one of those :meth:`retire` counted unreported (not to be
        published again), False when there are none left to match it."""
        with self._lock:
            left = self._late.get(sender, 0)
            if left <= 0:
                return False
            self._late[sender] = left - 1
            return True

    def counted_lost(self, sender: str) -> frozenset[str] | None:
        """The ids of the requests :meth:`drop` returned when ``sender``'s process was
        seen gone (counted lost then); None while it is not retired."""
        with self._lock:
            if sender in self._lost_ids:
                return self._lost_ids[sender]
            return frozenset() if sender in self._retired else None

    def serving(self, sender: str) -> bool:
        """Whether worker process ``sender`` has reported and is not known to be gone."""
        with self._lock:
            return sender in self._sender.values()

    def drop(self, worker: int) -> list[ActiveRequest]:
        """Worker ``worker``'s process is gone: forget its open requests (returned: as its
        last report had them), and its reports from now on."""
        return self.retire(worker, 0)[0]

    def retire(self, worker: int, opened: int, sender: str | None = None
               ) -> tuple[list[ActiveRequest], int]:
        """Worker ``worker``'s process is gone, having opened ``opened`` requests (the
        shared table's running total, :mod:`llmtop.fleet_counts`): forget its open requests
        and its reports from now on. Returned: its open requests as its last report had
        them, and how many of the requests it opened no report of it carried (opened −
        records taken from it − those open requests; never below 0): they ended or were
        open after its last report, their records dead with it. The caller counts them
        lost: as many records arriving late from it (its last POST, read after its death
        was seen) are not published again (:meth:`late_record`). ``sender``: the process's
        id as its launcher named it (:data:`SENDER_ENV`), known even when no report of it
        was read yet (else the one its reports gave, if any)."""
        with self._lock:
            reported = self._sender.pop(worker, None)
            sender = sender or reported
            rows = self.by_worker.pop(worker, {})
            taken = self._taken.pop(sender, 0) if sender else 0
            unreported = max(0, opened - taken - len(rows))
            if sender:
                _keep_newest(self._retired, sender, None)
                _keep_newest(self._lost_ids, sender, frozenset(rows), LOST_IDS_KEPT)
                _keep_newest(self._late, sender, unreported, LOST_IDS_KEPT)
            self.heard.pop(worker, None)
            return list(rows.values()), unreported

    def __getitem__(self, key: str) -> ActiveRequest:
        for rows in self.by_worker.values():
            if key in rows:
                return rows[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(chain.from_iterable(list(self.by_worker.values()))))

    def __len__(self) -> int:
        return sum(len(r) for r in self.by_worker.values())

    def values(self) -> ValuesView[ActiveRequest]:
        """Every open request (the snapshots and detectors read them all each tick: the
        generic Mapping view looked each key up again, 0.46 ms for 1,024 of them)."""
        return _FleetValues(self)


class _FleetValues(ValuesView[ActiveRequest]):
    def __init__(self, fleet: FleetActive) -> None:
        super().__init__(fleet)
        self._fleet = fleet

    def __iter__(self) -> Iterator[ActiveRequest]:
        rows = list(self._fleet.by_worker.values())
        return iter(list(chain.from_iterable(r.values() for r in rows)))


LOST_REPORT_S = 10.0
"""How often, at most, the coordinator raises ``EVENTS_LOST`` again with a grown count."""


class LostEvents:
    """Coordinator side: events the workers gave up before the coordinator had them (their
    buffer was full while it was too busy or unreachable, or it refused a POST). Each POST
    carries its process's running total; a total that grew raises ``EVENTS_LOST`` (critical:
    the counts, rates, percentiles, /metrics and the recording miss them), again with the
    new total at most every :data:`LOST_REPORT_S` seconds. Before, the totals were read and
    ignored: a worker could drop finished requests and every figure read low, silently."""

    def __init__(self, publish: Callable[[Event], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.clock = clock
        self.by_sender: dict[str, int] = {}
        self.by_worker: dict[int, int] = {}
        self.unreported = 0
        """Of :attr:`total`: the records killed workers had not sent yet
        (:meth:`killed`), counted as failed requests, not missing from the counts."""
        self.reported = 0
        self._last = -LOST_REPORT_S
        self._lock = threading.Lock()  # the ingest route's loop and the supervisor's

    @property
    def total(self) -> int:
        return sum(self.by_worker.values())

    def saw(self, worker: int, sender: str, dropped: int) -> None:
        """Worker ``worker``'s process ``sender`` has given up ``dropped`` events so far."""
        with self._lock:
            before = self.by_sender.get(sender, 0)
            if before or dropped:  # kept among the newest while it posts (can give up more)
                _keep_newest(self.by_sender, sender, max(before, dropped))
            if dropped > before:
                self.by_worker[worker] = self.by_worker.get(worker, 0) + dropped - before
            self._raise()

    def killed(self, worker: int, records: int) -> None:
        """Worker ``worker``'s process died with ``records`` finished requests' records not
        sent yet (requests that ended after its last report: those it had open then, and
        those no report carried, :meth:`FleetActive.retire`; the supervisor counts each as
        a failed request)."""
        if records <= 0:
            return
        with self._lock:
            self.by_worker[worker] = self.by_worker.get(worker, 0) + records
            self.unreported += records
            self._raise()

    def _raise(self) -> None:
        total = self.total
        now = self.clock()
        if total > self.reported and now - self._last >= LOST_REPORT_S:
            self.reported, self._last = total, now
            each = ", ".join(f"worker {w}: {n}" for w, n in sorted(self.by_worker.items()))
            given_up = total - self.unreported
            why = []
            if given_up > 0:
                why.append(
                    ("" if not self.unreported else f"{given_up} of them: ")
                    + "a worker's buffer overflowed while the coordinator was too busy or "
                    "unreachable, or it refused them; the counts, rates and percentiles, "
                    "/metrics and the recording miss them (fewer workers, or a core left "
                    "free for the coordinator, lets it keep up)")
            if self.unreported:
                n = self.unreported
                why.append(
                    f"{n} {'was the record' if n == 1 else 'were the records'} of "
                    f"request{'' if n == 1 else 's'} that ended in a killed worker before "
                    "it reported them (it reports every 0.5 s): counted as failed "
                    "requests, their outcome and details (tokens, latencies) unknown")
            self.publish(WarningEvent(
                unix_now(), "EVENTS_LOST", "critical",
                f"{total} events (finished requests, stream progress) never reached the "
                f"coordinator ({each}): " + "; ".join(why), "raised"))


def ingest_route(bus: EventBus, fleet: FleetActive, token: str,
                 lost: LostEvents | None = None, *,
                 out_of_files: OutOfFilesSources | None = None) -> web.RouteDef:
    """``out_of_files``: where a worker's ``OUT_OF_FILES`` goes, made one with the other
    processes' (without it: onto the bus as it came)."""
    last_seq: dict[str, int] = {}  # per worker process (sender): the last POST taken,
    # the newest SENDERS_KEPT (a worker restarted every few minutes is a new sender each time)
    if lost is None:
        lost = LostEvents(bus.publish)
    fleet.lost_events = lost  # a killed worker's unreported records are counted there too

    async def ingest(request: web.Request) -> web.Response:
        if not secrets.compare_digest(request.headers.get(TOKEN_HEADER, ""), token):
            return web.json_response({"error": "forbidden"}, status=403)
        parts: list[bytes] = []
        size = 0
        async for data in request.content.iter_any():
            size += len(data)
            if size > MAX_BODY:
                return web.json_response({"error": "ingest payload too large"}, status=413)
            parts.append(data)
        try:
            batch = decode_batch(b"".join(parts))
        except IngestError as exc:
            return web.json_response({"error": f"bad ingest payload: {exc}"}, status=400)
        if batch.seq > last_seq.get(batch.sender, 0):
            _keep_newest(last_seq, batch.sender, batch.seq)
            # a dead process's last report, read after its death was seen: the requests
            # then counted lost are not counted again from its records (was: once an
            # error, once as they ended); a live one's records are counted as taken
            # (what a killed worker opened and no record came for: FleetActive.retire)
            # (its open requests with them, in one step: FleetActive.took)
            records = sum(1 for ev in batch.events if type(ev) is RequestRecord)
            gone = None if fleet.took(batch.sender, records, batch.worker, batch.active) else (
                fleet.counted_lost(batch.sender))
            for ev in batch.events:
                if gone is not None and type(ev) is RequestRecord and (
                        ev.id in gone or fleet.late_record(batch.sender)):
                    continue
                if (type(ev) is WarningEvent and ev.code == OUT_OF_FILES
                        and out_of_files is not None):
                    out_of_files.saw(batch.sender, ev)
                else:
                    bus.publish(ev)
            lost.saw(batch.worker, batch.sender, batch.dropped)
        return web.json_response({"in_flight": len(fleet)})

    return web.post(INGEST_PATH, ingest)


def run_workers(cfg: Config, config_path: str | None = None) -> int:
    """The coordinator of ``llmtop run --workers N --headless`` (blocks until a signal)."""
    from llmtop.server import StartupError, serve_coordinator

    try:
        summary = asyncio.run(serve_coordinator(cfg, config_path=config_path))
    except StartupError as exc:
        pipe_out.say(f"llmtop run: error: {exc}", sys.stderr)
        return 2
    for line in summary.lines():
        pipe_out.say(line)
    return summary.exit_code
