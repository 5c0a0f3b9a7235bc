"""The aggregator: events in, windows of histograms and counters, snapshots out.

It subscribes to the bus (``bus.subscribe(aggregator.on_events)``) and is ticked by its
owner every 0.5–1 s (``tick``): each tick samples the proxy's live registry of active
requests — in flight, waiting (no first token yet), streaming — and the output tokens
each active stream has produced since the last tick, so system and per-user TPS follow
the tokens as they stream rather than jumping when a long request ends. When a request's
record arrives, whatever of its output tokens was not yet attributed is added then (its
final count from the engine's usage wins; the correction may be negative).
Both sides are keyed by the request id, which the proxy uses for both.

Latency samples follow the tokens in the same way. A stream's TTFT is filed by the tick
that first sees its first token. Its ITL and chunk-gap samples are filed from the
:class:`~llmtop.events.ChunkSlice` events the relay publishes while it streams (every 512
chunks or 2 s), into the interval they arrive in: a 10-minute answer's ITL shows in the
10 s and 60 s windows as it streams, not all at its end in the window it ended in. The
aggregator remembers how many chunks of each open stream it filed so; its record adds only
the samples of the chunks after those (every sample is filed once; records that no slice
preceded — replays, recordings, short answers — file all theirs). SLO attainment is still
judged per record, over all its chunks, when it ends. Live ITL weights: a chunk's token
count as the parser counted it, times its model's learned tokens per event (below) when
there is one — the engine's usage is not known until the record; rounded so a stream's live
weights add up to its count times the rate (:meth:`_take_slices`). The record's counts,
scaled to the usage, weigh the chunks it files; a stream's ITL weights then add up to its
usage only as closely as the rate was right (exactly when no rate was learned and the
usage equals the parser's count). A chunk whose weight is 0 gives no ITL sample and takes
no time: the next weighed chunk's gap runs from the last chunk that carried tokens, across
slices (the aggregator keeps each open stream's anchor) and into its record's share.

Live tokens are the proxy's count of content events (one token each) until the engine's
usage arrives with the record. Engines that pack several tokens into an event (speculative
decoding, a stream interval) would then read k× low while streaming and jump when the
request ends; so each model's tokens per event is learned from its finished requests that
carried usage (:data:`TPE_ALPHA`-weighted), and live events are attributed at that rate.
A window that begins at the aggregator's start (each one until it fills, "all" always)
also counts the tokens streamed since the last tick (:meth:`Aggregator._live_tail`): its
rates are divided by the time up to now, and nothing before its start balances the tick's
lag as in a sliding window.

Series: ``0`` is the system; users and models get bounded label sets (see
:mod:`llmtop.metrics.labels`); every latency sample is recorded to the system, its user
and its model. Windows are described in :mod:`llmtop.metrics.windows`, SLOs in
:mod:`llmtop.metrics.slo`, capacity in :mod:`llmtop.metrics.capacity`, the snapshot in
:mod:`llmtop.metrics.snapshot`.

Records are filed in batches: ``on_events`` does the per-record bookkeeping (labels,
the live-token remainder, ``recent``) at once and queues the rest; the histograms and
counters take the queue in one vectorised step when anything reads them (``view``,
``snapshot``, ``windows``, ``capacity``, ``clamped``, ``series``), when the current fine
interval is about to close (so every record lands in the interval it arrived in, exactly
as if filed at once), or when ``PENDING_RECORDS``/``PENDING_CHUNKS`` are queued. A batch's
fixed cost (some forty numpy calls) is then paid per read or per ~64 records instead of
per bus delivery (4–5 records every 50 ms at 64 streams): readers see every record
delivered so far, nothing lags.

Not thread-safe: call everything from the event loop that owns the proxy.
"""

from __future__ import annotations

import bisect
import itertools
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from llmtop.clock import unix_now
from llmtop.config import Config
from llmtop.events import (
    ActiveRequest,
    ChunkSlice,
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    WarningEvent,
)
from llmtop.metrics.capacity import CapacityBins
from llmtop.metrics.hdr import sparse_percentiles
from llmtop.metrics.ingest import (
    C_ERR,
    C_GOOD,
    C_IN,
    C_MET,
    C_OUT,
    C_REQ,
    COUNTERS,
    M_ITL,
    M_TTFT,
    ingest,
    output_tokens,
    slice_table,
    ttft_table,
)
from llmtop.metrics.labels import LabelSlots, model_label
from llmtop.metrics.slo import Slo
from llmtop.metrics.snapshot import build_snapshot  # not at the first request: no compile there
from llmtop.metrics.table import CountTable
from llmtop.metrics.windows import COARSE_S, FINE_S, Interval, Windows, WindowView
from llmtop.packed import HeldRecord, pack

MODEL_SLOTS: Final = 16
"""Models tracked one by one; the rest count as "other"."""
RECENT_MAX: Final = 500
"""Finished requests kept for ``/llmtop/v1/requests?state=recent``."""
RECENT_MAX_CHUNKS: Final = 1_000_000
"""…and at most this many chunks among them (the newest request always stays): held packed
(:mod:`llmtop.packed`, ~9 bytes a chunk), 500 answers of 32k tokens would otherwise hold
640 MB of chunk tuples."""
RECENT_PACK_CHUNKS: Final = 256
"""Records with this many chunks or more are held packed; packing costs ~20 µs a record,
which short answers (a few hundred KB for all 500) are not worth."""
SERIES_POINTS: Final = 150
"""Time-series points kept: one per 2 s, 5 minutes."""
ENGINE_HISTORY_S: Final = 320.0
_LIVE_FORGET_S: Final = 600.0
TPE_ALPHA: Final = 0.3
"""Weight of a finished request in its model's tokens-per-event estimate."""
TPE_MIN_EVENTS: Final = 8
"""Requests with fewer live events seen teach nothing (too coarse a ratio)."""
TPE_MODELS: Final = 64
"""Models whose tokens-per-event is remembered (a flood of names cannot grow memory)."""
PENDING_RECORDS: Final = 64
"""Records queued before they are filed without a reader asking ..."""
PENDING_CHUNKS: Final = 2048
"""... or chunks (a flush of 2,048 chunks: ~5 ms on a busy 2-core machine)."""
FILE_SLICE_CHUNKS: Final = 200_000
"""A flush files its records in slices of at most about this many chunks (a record is never
split): filing builds several arrays a chunk long, and 256 answers of 16k tokens ending
together, filed as one batch, took ``report`` to 1.9 GB."""



def active_rows(active: Mapping[str, ActiveRequest], now_ns: int | None = None
                ) -> list[dict[str, Any]]:
    """The requests in ``active`` as ``/requests?state=active`` lists them, oldest first
    (ages as of ``now_ns``, default now)."""
    t = time.perf_counter_ns() if now_ns is None else now_ns
    return [a.to_json_dict(t) for a in sorted(active.values(), key=lambda a: a.t0_ns)]

class Aggregator:
    """Aggregates request records and readings into windows; builds snapshots.

    ``active`` is the proxy's live registry (read, never mutated). ``clock`` gives unix
    seconds (inject a fake one in tests and replays); ``upstream`` is shown in snapshots.
    """

    def __init__(
        self,
        cfg: Config,
        active: Mapping[str, ActiveRequest] | None = None,
        *,
        clock: Callable[[], float] = unix_now,
        upstream: str = "",
    ) -> None:
        self.cfg = cfg
        self.slo = Slo.from_config(cfg)
        self.active: Mapping[str, ActiveRequest] = active if active is not None else {}
        self.clock = clock
        self.upstream = upstream
        self.host = socket.gethostname()
        self.started_at = clock()
        n_users = cfg.top_users
        self.users = LabelSlots(n_users, base=2, other_id=1)
        self.models = LabelSlots(MODEL_SLOTS, base=n_users + 3, other_id=n_users + 2)
        self.shape = (n_users + 3 + MODEL_SLOTS, len(COUNTERS))
        self._windows = Windows(self.shape, self.started_at,
                                on_fine_closed=self._on_fine_closed)
        self._capacity = CapacityBins()
        self._series: deque[dict[str, Any]] = deque(maxlen=SERIES_POINTS)
        self.recent: deque[RequestRecord | HeldRecord] = deque()
        self._recent_chunks = 0
        self.gpus: dict[int, GpuReading] = {}
        self.engine: EngineReading | None = None
        self.engine_history: deque[EngineReading] = deque()
        self.engine_first: EngineReading | None = None
        """The session's first engine reading with a TTFT histogram: what the engine's TTFT
        over the whole session ("all") counts from (the history keeps 320 s)."""
        self.engine_status: Callable[[], str] | None = None
        """The engine scraper's line ("vllm engine at URL", or why the last scrape failed:
        "no /metrics at URL (HTTP 404)"); None when there is no scraper."""
        self.gpu_status: Callable[[], str] | None = None
        """The GPU source's line ("2 GPUs", "GPU 1 lost", why there are none)."""
        self.warnings: dict[str, WarningEvent] = {}
        """Currently raised warnings by code (the raising event, so ``t`` is "since")."""
        self.warning_codes: set[str] = set()
        """Every warning code seen (raised or cleared) — for the Prometheus gauges."""
        self._clamped = 0
        self.records_seen = 0
        """Records received (filed or queued)."""
        self._pending: list[RequestRecord] = []
        self._pending_users: list[int] = []
        self._pending_models: list[int] = []
        self._pending_rest: list[int] = []
        self._pending_where: list[dict[tuple[int, int], int] | None] = []
        """Per queued record: where its live tokens were counted, (user series, model series)
        → tokens, when that is not just its own user and model (see :meth:`_file`)."""
        self._pending_ttft: list[bool] = []
        self._pending_live: list[tuple[int, int]] = []
        """Per queued record: how many of its first chunks slices filed, and the one of them
        its first later ITL gap runs from (``_itl_live``'s anchor index; :func:`ingest`)."""
        self._pending_slices: list[tuple[ChunkSlice, int, int, Sequence[int], int]] = []
        """Slices taken and not yet filed: the slice, its user and model series, its
        chunks' token counts (the weights its ITL samples get), the ITL anchor of its first
        point (:func:`slice_table`'s ``anchors_ns``)."""
        self._pending_chunks = 0
        self.filing_errors = 0
        """Batches of records dropped because filing them raised (a bug, not traffic)."""
        self.last_filing_error: BaseException | None = None
        self._live: dict[str, _LiveState] = {}
        """Active request id → (content events seen at the last tick, tokens attributed —
        unrounded —, chunks seen at the last tick; the model label, user series and model
        series its tokens were last counted under (``""``, -1, -1 before any), and the
        pairs (user series, model series) → tokens it was counted under before, or None).
        Usually one pair, the record's own; another when the answer names another model
        than the request asked for, or the user was promoted out of "other" while the
        stream was open (see :meth:`_file`)."""
        self._owed: dict[tuple[int, int], int] = {}
        """(user series, model series) → output tokens over-attributed live to requests of
        that user and model and not yet taken back from the windows (see
        :meth:`_settle_out`); bounded by the series, not the requests."""
        self._live_seen: dict[str, float] = {}
        self._carried: dict[str, int] = {}
        """Open request id → its output tokens streamed before this aggregator started, for
        the requests :meth:`carry_in` was told of (none live)."""
        self._pending_before: list[int] = []
        """Per queued record: its tokens in :attr:`_carried`, or −1 (began in the span)."""
        self.tokens_per_event: dict[str, float] = {}
        """Model → output tokens per content event, learned from finished requests with
        usage (absent: 1)."""
        self._ttft_filed: set[str] = set()
        """Active request ids whose TTFT sample a tick filed (their records add none)."""
        self._itl_live: dict[str, tuple[int, float, float, int, int]] = {}
        """Open request id → (its first chunks whose ITL and chunk-gap samples slices filed,
        how many, the tokens attributed to them — unrounded —, when its last slice came,
        the ``perf_counter_ns`` time of the last of them that carried tokens — or of its
        first chunk —: the next slice's ITL anchor, so a 0-token chunk at a slice's end
        swallows no time —, and that chunk's index: its record's first ITL gap after the
        chunks filed live runs from it, whatever the record's own counts say of them)."""
        self._scored: set[str] = set()
        """Active request ids already counted in their user's traffic score."""
        self._coarse_start = self._windows.coarse_cur.start
        self._last_conc = (0, 0, 0)

    # -- filed state (queued records are filed first) -------------------------------------

    @property
    def windows(self) -> Windows:
        """The interval rings (queued records filed first)."""
        self.flush()
        return self._windows

    @property
    def capacity(self) -> CapacityBins:
        """Per-concurrency bins since the start (queued records filed first)."""
        self.flush()
        return self._capacity

    @property
    def series(self) -> deque[dict[str, Any]]:
        """One time-series point per closed fine interval (queued records filed first)."""
        self.flush()
        return self._series

    @property
    def pending_records(self) -> int:
        """Records received and not yet filed into the windows."""
        return len(self._pending)

    @property
    def clamped(self) -> int:
        """Latency values out of the histograms' range (clamped) or NaN (dropped)."""
        self.flush()
        return self._clamped

    # -- input ---------------------------------------------------------------------------

    def on_events(self, batch: Sequence[Event]) -> None:
        """Bus subscriber: file a batch of events (records, readings, warnings)."""
        now = self.clock()
        self._advance(now)
        records: list[RequestRecord] = []
        slices: list[ChunkSlice] = []
        for e in batch:
            if isinstance(e, RequestRecord):
                records.append(e)
            elif isinstance(e, ChunkSlice):
                slices.append(e)
            elif isinstance(e, GpuReading):
                self.gpus[e.index] = e
            elif isinstance(e, EngineReading):
                self._on_engine(e)
            elif isinstance(e, WarningEvent):
                self.warning_codes.add(e.code)
                if e.state == "raised":
                    if e.code not in self.warnings:
                        self.warnings[e.code] = e
                    else:  # keep the original "since", refresh the text
                        old = self.warnings[e.code]
                        self.warnings[e.code] = WarningEvent(old.t, e.code, e.severity,
                                                             e.message, "raised")
                else:
                    self.warnings.pop(e.code, None)
        # a stream's slices come before its record: taken first, they are counted in it
        if slices:
            self._take_slices(slices, now)
        if records:
            self._ingest(records)

    def _take_slices(self, slices: list[ChunkSlice], now: float) -> None:
        """Queue open streams' latest chunks to be filed (:func:`slice_table`) and note how
        many of each stream's chunks are then filed (its record files the rest).

        A slice that does not follow the stream's last one taken (one lost on the way: a
        worker's full buffer) is left out, and so are the stream's later ones: its record
        files every chunk from the first not taken — each sample once, some late.

        Weights: each chunk's count as the parser made it, times the model's learned
        tokens per event (:attr:`tokens_per_event`) when it has one other than 1 — an
        engine that packs k tokens into an event would otherwise give k× too long ITL
        samples until the record. Rounded on the stream's running total, so its live
        weights add up to its count times the rate (give or take one token)."""
        state = self._itl_live
        series_u, series_m = self.users.series_for, self.models.series_for
        tpe_of = self.tokens_per_event.get
        pending = self._pending_slices
        chunks = 0
        for sl in slices:
            n = len(sl.offsets_ns)
            if not n or len(sl.tokens) != n:
                continue
            filed, acc, _, anchor, a_idx = state.get(sl.id, _NO_SLICE)
            if sl.first != filed or (filed > 0) != (sl.prev_ns is not None):
                continue
            model = model_label(sl.model)
            tpe = tpe_of(model)
            toks: Sequence[int] = sl.tokens
            if tpe is None or tpe == 1.0:
                acc += sum(toks)
            else:
                run = acc + np.cumsum(np.asarray(toks, dtype=np.float64)) * tpe
                ends = np.floor(np.concatenate(([acc], run)) + 0.5).astype(np.int64)
                toks = np.diff(ends).tolist()
                acc = float(run[-1])
            offs = sl.offsets_ns
            if not filed:  # the stream's first chunk: its own anchor, whatever its count
                anchor, a_idx = offs[0], 0
            first_anchor = anchor
            for j in range(n - 1, -1 if filed else 0, -1):
                if toks[j] > 0:
                    anchor, a_idx = offs[j], filed + j
                    break
            state[sl.id] = (filed + n, acc, now, anchor, a_idx)
            pending.append((sl, series_u(sl.user, 0.0), series_m(model, 0.0), toks,
                            first_anchor))
            chunks += n
        self._pending_chunks += chunks
        if self._pending_chunks >= PENDING_CHUNKS:
            self.flush()

    def _on_engine(self, e: EngineReading) -> None:
        self.engine = e
        if self.engine_first is None and e.ttft_buckets:
            self.engine_first = e
        h = self.engine_history
        h.append(e)
        while len(h) > 2 and h[1].t < e.t - ENGINE_HISTORY_S:
            h.popleft()

    def _ingest(self, records: list[RequestRecord]) -> None:
        """Label and queue records (what must happen in arrival order); file the queue
        once it is long enough."""
        users, models = self._pending_users, self._pending_models
        remainder, scored = self._pending_rest, self._scored
        where_l = self._pending_where
        live, seen = self._live, self._live_seen
        ttft_filed, ttft_pending = self._ttft_filed, self._pending_ttft
        itl_live, live_pending = self._itl_live, self._pending_live
        carried, before_l = self._carried, self._pending_before
        chunks = 0
        for r in records:
            w = 0.0 if r.id in scored else 1.0
            u = self.users.series_for(r.user, w)
            users.append(u)
            model = model_label(r.model)
            m = self.models.series_for(model, w)
            models.append(m)
            events, attributed, chunks_seen, asked, su, sm, earlier = live.pop(r.id, _NOT_LIVE)
            last_tick = seen.pop(r.id, None)
            counted = int(attributed + 0.5)
            pre = carried.pop(r.id, -1) if carried else -1
            before_l.append(pre)
            # (tokens streamed before the start are in no window: not added now either)
            remainder.append(output_tokens(r) - max(pre, 0) - counted)
            if su < 0 or (earlier is None and su == u and sm == m):
                where_l.append(None)  # no live tokens, or all where its record is
            else:
                wh = dict(earlier) if earlier else {}
                last = counted - sum(wh.values())
                wh[su, sm] = wh.pop((su, sm), 0) + last  # the last pair last
                where_l.append(wh)
            if not asked:
                asked = model
            if r.token_source == "usage" and r.stream and last_tick is not None:
                if chunks_seen <= 0 < events:  # a registry that does not count chunks
                    chunks_seen = bisect.bisect_right(r.chunk_offsets_s,
                                                      last_tick - r.t_start)
                self._learn_tpe(r, model, events, chunks_seen)
                if asked != model:  # the rate the next stream asking for it is counted at
                    self._learn_tpe(r, asked, events, chunks_seen)
            scored.discard(r.id)
            if r.id in ttft_filed:
                ttft_filed.discard(r.id)
                ttft_pending.append(True)
            else:
                ttft_pending.append(False)
            st = itl_live.pop(r.id, None) if itl_live else None
            live_pending.append((0, 0) if st is None else (st[0], st[4]))
            chunks += len(r.chunk_offsets_s)
        self._pending.extend(records)
        self._pending_chunks += chunks
        self.records_seen += len(records)
        self._keep_recent(records)
        if len(self._pending) >= PENDING_RECORDS or self._pending_chunks >= PENDING_CHUNKS:
            self.flush()

    def _keep_recent(self, records: list[RequestRecord]) -> None:
        """Hold the newest finished requests for :meth:`recent_requests`, packed, within
        :data:`RECENT_MAX` requests and :data:`RECENT_MAX_CHUNKS` chunks."""
        recent = self.recent
        held = self._recent_chunks
        for r in records[-RECENT_MAX:]:
            n = len(r.chunk_offsets_s)
            recent.append(pack(r) if n >= RECENT_PACK_CHUNKS else r)
            held += n
        while len(recent) > RECENT_MAX or (held > RECENT_MAX_CHUNKS and len(recent) > 1):
            held -= _chunks_of(recent.popleft())
        self._recent_chunks = held

    def _learn_tpe(self, r: RequestRecord, model: str, events: int, chunks: int) -> None:
        """Update ``model``'s (the label of ``r.model``, or of the model its request asked
        for) tokens per event from what the last tick saw of it: its
        first ``chunks`` chunks carried ``events`` content events, and the record's
        per-chunk counts (scaled to the engine's usage) say how many tokens those chunks
        were. Exact whatever an engine packs into a read: counting the chunks after the
        last tick as one event each taught engines whose reads carry several events a rate
        above 1."""
        toks = r.chunk_tokens
        usage = r.completion_tokens
        if usage is None or events < TPE_MIN_EVENTS or chunks <= 0 or chunks > len(toks):
            return
        total = sum(toks)
        seen = sum(toks[:chunks]) if chunks < len(toks) else total
        if total <= 0:
            return
        # the per-chunk counts sum to the usage (the relay scales them); if they do not,
        # they still share it in proportion
        sample = min(max(usage * seen / (total * events), 0.5), 64.0)
        old = self.tokens_per_event.get(model)
        if old is None:  # a model's first request sets it; later ones move it
            if len(self.tokens_per_event) >= TPE_MODELS:
                return
            old = sample
        new = old + TPE_ALPHA * (sample - old)
        self.tokens_per_event[model] = 1.0 if abs(new - 1.0) < 0.02 else new

    def flush(self) -> None:
        """File the queued slices and records into the current interval (and the records
        into the capacity bins)."""
        if self._pending_slices:
            self._file_slices()
        records = self._pending
        if not records:
            self._pending_chunks = 0
            return
        users, models, rest = self._pending_users, self._pending_models, self._pending_rest
        where = self._pending_where
        self._pending_where = []
        self._pending = []
        self._pending_users = []
        self._pending_models = []
        self._pending_rest = []
        ttft_filed = self._pending_ttft
        self._pending_ttft = []
        live = self._pending_live
        self._pending_live = []
        before = self._pending_before
        self._pending_before = []
        self._pending_chunks = 0
        start = n = 0
        for i, r in enumerate(records):
            m = len(r.chunk_offsets_s)
            if n and n + m > FILE_SLICE_CHUNKS:
                self._file(records[start:i], users[start:i], models[start:i], rest[start:i],
                           ttft_filed[start:i], live[start:i], where[start:i], before[start:i])
                start, n = i, 0
            n += m
        if start == 0:
            self._file(records, users, models, rest, ttft_filed, live, where, before)
        else:
            self._file(records[start:], users[start:], models[start:], rest[start:],
                       ttft_filed[start:], live[start:], where[start:], before[start:])

    def _file_slices(self) -> None:
        """File the queued slices' ITL and chunk-gap samples (:func:`slice_table`)."""
        items = self._pending_slices
        self._pending_slices = []
        points: list[Sequence[int]] = []
        weights: list[Sequence[int]] = []
        lens: list[int] = []
        anchors: list[int] = []
        moved = False  # a slice's chunk before carried 0 tokens: its anchor is earlier
        for sl, _, _, toks, anchor in items:
            if sl.prev_ns is not None:
                points.append((sl.prev_ns,))
                weights.append((0,))
                moved = moved or anchor != sl.prev_ns
            points.append(sl.offsets_ns)
            weights.append(toks)
            lens.append(len(sl.offsets_ns) + (sl.prev_ns is not None))
            anchors.append(anchor)
        total = sum(lens)
        try:
            table, clamped = slice_table(
                np.fromiter(itertools.chain.from_iterable(points), np.int64, total),
                [it[0].t0_ns for it in items], lens,
                np.fromiter(itertools.chain.from_iterable(weights), np.int64, total),
                [it[1] for it in items], [it[2] for it in items],
                anchors if moved else None)
        except Exception as exc:  # as _file: counted, never breaks the reader that asked
            self.filing_errors += 1
            self.last_filing_error = exc
            return
        self._windows.add(table)
        self._clamped += clamped

    def _file(self, records: list[RequestRecord], users: list[int], models: list[int],
              rest: list[int], ttft_filed: list[bool], live: list[tuple[int, int]],
              where: list[dict[tuple[int, int], int] | None], before: list[int]) -> None:
        """File one slice of the queue.

        ``before``: per record, the output tokens it streamed before this aggregator started
        (:meth:`carry_in`), or −1; they count in no window (:func:`ingest`'s
        ``before_start``).

        A record whose live tokens were counted elsewhere than in its own user and model
        series (``where``: the request asked for "gpt-4o" and the answer named
        "gpt-4o-2024-08-06"; the user was promoted out of "other" while it streamed) has
        the rest of its tokens added, or taken back, where its live tokens were last counted
        (a take-back first from each pair as far as it holds this request's tokens), so in
        the windows every token is in one row and no row goes below zero. The all-time
        counters then move the request's whole output to its own series (``moved``), so
        each all-time row holds exactly the engines' counts of the requests it counts."""
        takes: dict[tuple[int, int], int] = {}
        extra: np.ndarray[Any, np.dtype[np.int64]] | None = None
        moved: np.ndarray[Any, np.dtype[np.int64]] | None = None
        for i, wh in enumerate(where):
            if wh is None:
                continue
            u, m = users[i], models[i]
            if len(wh) == 1 and (u, m) in wh:
                continue  # counted where its record is: the usual case
            if extra is None or moved is None:
                extra = np.zeros(self.shape[0], dtype=np.int64)
                moved = np.zeros(self.shape[0], dtype=np.int64)
                rest = list(rest)
            x = rest[i]
            rest[i] = 0
            held = dict(wh)  # per pair: this request's tokens there once settled
            last = next(reversed(wh))
            if x > 0:
                extra[[0, *last]] += x
                held[last] += x
            elif x < 0:
                want = -x
                for key in reversed(wh):
                    t = min(want, held[key])
                    if t > 0:
                        takes[key] = takes.get(key, 0) + t
                        held[key] -= t
                        want -= t
                if want:
                    takes[last] = takes.get(last, 0) + want
                    held[last] -= want
            for (pu, pm), t in held.items():
                moved[[pu, pm]] -= t
                moved[[u, m]] += t
        if min(rest, default=0) < 0:  # over-attributed live: given back per request below
            for u, m, x in zip(users, models, rest, strict=True):
                if x < 0:
                    takes[u, m] = takes.get((u, m), 0) - x
            rest = [x if x > 0 else 0 for x in rest]
        try:
            b = ingest(records, users, models, rest, self.slo, self.shape, ttft_filed,
                       [f for f, _ in live], before if max(before, default=-1) >= 0 else None,
                       live_anchor=[a for _, a in live])
        except Exception as exc:  # filing runs inside readers and ticks too
            # a batch that cannot be filed is dropped (as a failing bus subscriber's batch
            # is), counted, and never breaks the tick or the snapshot that asked
            self.filing_errors += 1
            self.last_filing_error = exc
            return
        if extra is not None:
            b.counters[:, C_OUT] += extra
        owed = self._settle_out(b.counters, takes)
        self._windows.add(b.table, b.counters)
        if moved is not None:
            owed = moved if owed is None else owed + moved
        if owed is not None:
            self._windows.add_to_total(C_OUT, owed)
        # the capacity bins hold answers under load: the proxy's own 502s of an outage (it
        # could not connect) say nothing about how much load the engine takes — with them a
        # minute's outage left "max concurrency at SLO ≈ 0" long after the engine was back
        down = [i for i, r in enumerate(records) if r.upstream_unreachable]
        if down:
            keep = np.ones(len(records), dtype=bool)
            keep[down] = False
            self._capacity.add(b.concurrency[keep], b.met[keep], b.good_tokens[keep],
                               b.e2e_s[keep], b.judged[keep])
        else:
            self._capacity.add(b.concurrency, b.met, b.good_tokens, b.e2e_s, b.judged)
        self._clamped += b.clamped

    def _settle_out(
        self, counters: np.ndarray[Any, np.dtype[np.int64]],
        takes: dict[tuple[int, int], int] | None = None,
    ) -> np.ndarray[Any, np.dtype[np.int64]] | None:
        """Take back over-attributed output tokens, keeping every series' output tokens in
        the current interval at or above zero.

        Live tokens are attributed at the model's learned rate; when a request ends, its
        final count corrects them, downwards if the rate was too high for it. Taken at once,
        that correction made a window's output tokens/s negative. ``counters`` holds the
        tokens to add (none negative); ``takes`` what ended requests take back, per (user
        series, model series). A take-back is one per request: its user, its model and the
        system give back the same amount, as far as the current interval (with these
        tokens) holds output tokens of both its user and its model; the rest is owed
        (``_owed``) and taken the same way from later tokens, so the windows' totals come out
        exact once that user and model have streamed as many again. The system's row is
        then the sum of the users' rows and the sum of the models' rows in every window.
        (Owed per series, the system paid a user's take-back with the other users' tokens
        and read 0 tok/s while another user streamed 142; owed per user and per model, one
        model's row read 0 while the system read the users' sum.)

        The all-time total needs no such smoothing (it holds every token counted so far, so
        a correction cannot take it below zero): the return value is what it must get on
        top of ``counters`` — the change in what is owed — so the session's totals equal
        the engine's count at once (``None``: nothing to add)."""
        if not takes and not self._owed:
            return None
        col = counters[:, C_OUT]
        exact = col.copy()  # what the all-time total gets: the tokens less every take-back
        if takes:
            for (u, m), x in takes.items():
                exact[0] -= x
                exact[u] -= x
                exact[m] -= x
            owing = dict(self._owed)
            for key, x in takes.items():
                owing[key] = owing.get(key, 0) + x
        else:
            owing = self._owed
        applied, self._owed = self._give_back(col, owing)
        counters[:, C_OUT] = applied
        owed: np.ndarray[Any, np.dtype[np.int64]] = exact - applied
        return owed

    def _give_back(
        self, col: np.ndarray[Any, np.dtype[np.int64]], owing: Mapping[tuple[int, int], int],
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], dict[tuple[int, int], int]]:
        """``col`` (output tokens per series to add to the current interval, none negative)
        less what ``owing`` takes back from it, each (user, model) pair at most what both
        its rows hold in the current interval with ``col``; and what is left owing. Pure:
        :meth:`_settle_out` keeps the result, :meth:`_live_tail` only reads it."""
        held = (self._windows.cur.counters[:, C_OUT] + col).tolist()
        out = col.copy()
        left: dict[tuple[int, int], int] = {}
        for (u, m), want in owing.items():
            x = min(want, held[u], held[m], held[0])
            if x > 0:
                held[0] -= x
                held[u] -= x
                held[m] -= x
                out[0] -= x
                out[u] -= x
                out[m] -= x
            else:
                x = 0
            if want > x:
                left[u, m] = want - x
        return out, left

    def tick(self, now: float | None = None) -> None:
        """Sample concurrency and live tokens from the active registry; rotate intervals."""
        t = self.clock() if now is None else now
        self._advance(t)
        waiting = 0
        delta: np.ndarray[Any, np.dtype[np.int64]] | None = None
        live, seen = self._live, self._live_seen
        tpe_of = self.tokens_per_event.get if self.tokens_per_event else None
        actives = list(self.active.values())
        ttft_filed = self._ttft_filed
        first: list[ActiveRequest] = []
        for a in actives:
            if a.first_token_ns is None:
                waiting += 1
            elif a.stream and a.id not in ttft_filed:
                first.append(a)
            prev = live.get(a.id)
            if prev is None:
                prev = live[a.id] = _NOT_LIVE
            if a.user and a.id not in self._scored:  # the user is known once the body is read
                self._scored.add(a.id)
                self.users.series_for(a.user)
                self.models.series_for(model_label(a.model))
            seen[a.id] = t
            raw = a.tokens
            if raw == prev[0]:
                continue
            # only the events since the last tick take the model's rate now: re-rating the
            # whole stream made a rate change re-count thousands of tokens in one tick
            model = model_label(a.model)
            tpe = tpe_of(model) if tpe_of is not None else None
            attributed = prev[1] + (raw - prev[0] if tpe is None else (raw - prev[0]) * tpe)
            d = int(attributed + 0.5) - int(prev[1] + 0.5)
            psu, psm, earlier = prev[4], prev[5], prev[6]
            if d:
                if delta is None:
                    delta = np.zeros(self.shape, dtype=np.int64)
                su, sm = self.users.peek(a.user), self.models.peek(model)
                delta[0, C_OUT] += d
                delta[su, C_OUT] += d
                delta[sm, C_OUT] += d
                if (su != psu or sm != psm) and psu >= 0:  # counted elsewhere from now on
                    earlier = dict(earlier) if earlier else {}
                    before = int(prev[1] + 0.5) - sum(earlier.values())
                    earlier[psu, psm] = earlier.get((psu, psm), 0) + before
                live[a.id] = (raw, attributed, a.chunks, model, su, sm, earlier)
            else:
                live[a.id] = (raw, attributed, a.chunks, prev[3], psu, psm, earlier)
        if first:
            self._file_first_tokens(first)
        if delta is not None:
            owed = self._settle_out(delta)
            self._windows.add(CountTable.empty(), delta)
            if owed is not None:
                self._windows.add_to_total(C_OUT, owed)
        n = len(actives)
        self._last_conc = (n, waiting, n - waiting)
        self._windows.sample(self._last_conc)
        if len(seen) > n:
            for rid in [r for r, ts in seen.items() if t - ts > _LIVE_FORGET_S]:
                seen.pop(rid, None)
                live.pop(rid, None)
                self._carried.pop(rid, None)
                self._scored.discard(rid)
                ttft_filed.discard(rid)
        itl_live = self._itl_live
        if len(itl_live) > n:  # streams whose records never came (nor slices, for long)
            for rid in [r for r, st in itl_live.items()
                        if t - max(st[2], seen.get(r, st[2])) > _LIVE_FORGET_S]:
                del itl_live[rid]

    def carry_in(self, a: ActiveRequest, tokens: int) -> None:
        """``a`` was already open when this aggregator started — a replay of a recording
        started mid-traffic (or of a rotated part read alone) starts at the recording's
        ``started_at`` — and had streamed ``a.tokens`` content events in ``a.chunks``
        chunks, ``tokens`` output tokens, by then. Those came before the span every window
        and rate here runs over, and are never counted: the ticks attribute only what it
        streams from now on, and its record only the rest of its output; its finished and
        good tokens leave them out, and its prompt's input tokens (sent before the start)
        count not at all (:func:`~llmtop.metrics.ingest.ingest`'s ``before_start``). Its
        latency samples and SLO verdict are any record's. Call it before the first tick
        that sees ``a`` in the registry."""
        self._live[a.id] = (a.tokens, 0.0, a.chunks, "", -1, -1, None)
        self._carried[a.id] = max(0, tokens)

    def _file_first_tokens(self, first: list[ActiveRequest]) -> None:
        """File the TTFT of streams whose first token this tick is the first to see, into
        the current interval: a 10-minute answer's TTFT is shown (and judged by the
        detectors reading the windows) when its first token comes, not when it ends. Its
        record then adds no TTFT sample; its TTFT objective is still judged with it."""
        peek_u, peek_m = self.users.peek, self.models.peek
        ttfts: list[float] = []
        user_ids: list[int] = []
        model_ids: list[int] = []
        for a in first:
            if a.first_token_ns is not None:
                ttfts.append((a.first_token_ns - a.t0_ns) / 1e9)
                user_ids.append(peek_u(a.user))
                model_ids.append(peek_m(model_label(a.model)))
        table, clamped = ttft_table(ttfts, user_ids, model_ids)
        self._ttft_filed.update(a.id for a in first)
        self._clamped += clamped
        self._windows.add(table)

    def _advance(self, now: float) -> None:
        w = self._windows
        if now >= w.cur.end:
            self.flush()  # queued records belong to the interval about to close
        w.advance(now)
        if w.coarse_cur.start != self._coarse_start:
            elapsed = w.coarse_cur.start - self._coarse_start
            self._coarse_start = w.coarse_cur.start
            remap = self.users.rebalance(elapsed) | self.models.rebalance(elapsed)
            w.remap_series(remap)
            if remap:  # what a folded series owes or holds of a stream, its new one does
                self._owed = _remap_pairs(self._owed, remap)
                live = self._live
                for rid, st in live.items():
                    su, sm, earlier = st[4], st[5], st[6]
                    if su in remap or sm in remap or (
                            earlier and any(u in remap or m in remap for u, m in earlier)):
                        live[rid] = (*st[:4], remap.get(su, su), remap.get(sm, sm),
                                     _remap_pairs(earlier, remap) if earlier else earlier)

    def _on_fine_closed(self, iv: Interval) -> None:
        span = iv.end - max(iv.start, self.started_at)
        if span <= 0:
            return
        # at least a second, as the snapshot's span: the first interval can be 10 ms long,
        # and one request in it plotted 100 req/s (the snapshot of the moment read 1)
        span = max(span, 1.0)
        c = iv.counters[0]
        samples = iv.conc_sum[-1]

        def p95(metric: int) -> float | None:
            idx, cnt = iv.table.group_slice(metric, 0)
            return sparse_percentiles(idx, cnt, (95,))[0] / 1e6 if len(idx) else None

        def mean(i: int) -> float | None:
            return float(iv.conc_sum[i] / samples) if samples else None

        self._series.append({
            "t": iv.end,
            "rps": float(c[C_REQ]) / span,
            "output_tps": float(c[C_OUT]) / span,
            "input_tps": float(c[C_IN]) / span,
            "goodput_tps": float(c[C_GOOD]) / span,
            "errors": int(c[C_ERR]),
            "requests": int(c[C_REQ]),
            "slo_met": int(c[C_MET]),
            "in_flight": mean(0),
            "waiting": mean(1),
            "streaming": mean(2),
            "ttft_p95": p95(M_TTFT),
            "itl_p95": p95(M_ITL),
        })

    # -- output --------------------------------------------------------------------------

    def view(self, window_s: int | None, now: float | None = None) -> WindowView:
        """The raw window data (tables and counters) — for the snapshot and Prometheus."""
        t = self.clock() if now is None else now
        self._advance(t)
        self.flush()
        v = self._windows.view(window_s, t)
        if v.start <= self.started_at and self.active:
            tail = self._live_tail(all_time=window_s is None)
            if tail is not None:
                v.counters[:, C_OUT] += tail
        return v

    def _live_tail(self, *, all_time: bool) -> np.ndarray[Any, np.dtype[np.int64]] | None:
        """Per series: the output tokens the open streams produced since the last tick —
        what the next tick will attribute (same rate, same rounding, the same debt taken
        back: ``all_time`` for the all-time counters, which :meth:`_settle_out` does not
        smooth), without attributing them. ``None``: nothing.

        :meth:`view` adds them to a window that begins at the aggregator's start (every
        window until it fills; "all" always). Live tokens are attributed by the ticks, so a
        window's output tokens run to the last tick while its span runs to now. A sliding
        window's first tick brings in up to a tick of tokens from before its start, which
        this tail balances on average; a window from the start has none before it and read
        low by the tail: 3.4 s after start at a steady 100 tok/s, 88 (300 ÷ 3.4)."""
        live = self._live
        tpe_of = self.tokens_per_event.get if self.tokens_per_event else None
        by_user: dict[str, int] = {}
        by_model: dict[str, int] = {}
        for a in list(self.active.values()):
            prev = live.get(a.id, _NOT_LIVE)
            new = a.tokens - prev[0]
            if not new:
                continue
            prev_att = prev[1]
            model = model_label(a.model)
            tpe = tpe_of(model) if tpe_of is not None else None
            attributed = prev_att + (new if tpe is None else new * tpe)
            d = int(attributed + 0.5) - int(prev_att + 0.5)
            if d:
                by_user[a.user] = by_user.get(a.user, 0) + d
                by_model[model] = by_model.get(model, 0) + d
        if not by_user:
            return None
        # summed in a list, made an array once (numpy's per-element updates and its min
        # were most of this on the cold caches a snapshot meets, twice a second)
        tokens = [0] * self.shape[0]
        tokens[0] = sum(by_user.values())
        for names, slots in ((by_user, self.users), (by_model, self.models)):
            for name, d in names.items():
                tokens[slots.peek(name)] += d
        col = np.array(tokens, dtype=np.int64)
        if all_time or not self._owed:
            return col
        return self._give_back(col, self._owed)[0]  # as _settle_out, owing on as before

    def live_counts(self) -> tuple[dict[int, list[int]], tuple[int, int, int]]:
        """In flight now from the registry: per user series ``[in_flight, waiting,
        streaming]`` and the system totals. A user first seen here takes a free slot."""
        per: dict[int, list[int]] = {}
        waiting = n = 0
        users = self.users
        ids, other = users.ids, users.other_id
        for a in list(self.active.values()):  # 1,024 of them under a soak: kept lean
            n += 1
            user = a.user
            sid = ids.get(user) if user else other
            if sid is None:
                sid = users.series_for(user, 0.0) if users.has_free else other
            row = per.get(sid)
            if row is None:
                row = per[sid] = [0, 0, 0]
            row[0] += 1
            if a.first_token_ns is None:
                waiting += 1
                row[1] += 1
            else:
                row[2] += 1
        return per, (n, waiting, n - waiting)

    def snapshot(
        self, window_s: int | None = 60, *, user_histograms: bool = False,
        capacity_bins: bool = True, histograms: bool = True,
    ) -> dict[str, Any]:
        """The admin API's snapshot over the last ``window_s`` seconds (``None`` = all).

        ``user_histograms`` adds each user's encoded TTFT/ITL/TPOT/E2E histograms, so
        :func:`llmtop.metrics.merge.merge_snapshots` merges per-user percentiles exactly
        (opt-in: a zlib stream per histogram, tens of ms with 100 users).
        ``capacity_bins`` keeps ``capacity.bins`` (what merging the capacity estimate needs).
        ``histograms=False`` leaves the system's encoded histograms (``histograms``) out:
        a screen of one proxy does not read them, and encoding them is a quarter of the
        build.
        """
        return build_snapshot(self, window_s, user_histograms=user_histograms,
                              capacity_bins=capacity_bins, histograms=histograms)

    def recent_requests(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` finished requests, oldest first, in the recording's shape."""
        rs = list(self.recent)[-limit:] if limit > 0 else []
        return [(r.unpack() if isinstance(r, HeldRecord) else r).to_json_dict() for r in rs]

    def active_requests(self, now_ns: int | None = None) -> list[dict[str, Any]]:
        """Requests open now (fields so far), oldest first."""
        return active_rows(self.active, now_ns)

    @property
    def interval_s(self) -> tuple[float, float]:
        """(fine, coarse) interval lengths in seconds."""
        return FINE_S, COARSE_S


def _remap_pairs(pairs: dict[tuple[int, int], int], remap: Mapping[int, int]
                 ) -> dict[tuple[int, int], int]:
    """``pairs`` (user series, model series) → amount, with series folded as ``remap``
    says (amounts of pairs that become one added up)."""
    out: dict[tuple[int, int], int] = {}
    for (u, m), x in pairs.items():
        key = (remap.get(u, u), remap.get(m, m))
        out[key] = out.get(key, 0) + x
    return out


_LiveState = tuple[int, float, int, str, int, int, dict[tuple[int, int], int] | None]
"""What :attr:`Aggregator._live` holds of an open stream."""
_NOT_LIVE: Final[_LiveState] = (0, 0.0, 0, "", -1, -1, None)
"""What :meth:`Aggregator._live_tail` takes for a stream no tick has seen yet."""
_NO_SLICE: Final[tuple[int, float, float, int, int]] = (0, 0.0, 0.0, 0, 0)
"""What :attr:`Aggregator._itl_live` holds of a stream no slice was taken of (its anchor is
set by its first slice)."""


def _chunks_of(r: RequestRecord | HeldRecord) -> int:
    """Chunks a held recent request counts against :data:`RECENT_MAX_CHUNKS`."""
    if isinstance(r, HeldRecord):
        return len(r.offsets) // 8
    return len(r.chunk_offsets_s)
