"""The rolling evidence the saturation detectors look at.

Fed from the bus (finished requests, engine and GPU readings) and from periodic samples of
the proxy's open requests. Everything is bounded and cheap per tick whatever the request
rate: finished requests (with their chunk times) are kept for the short windows; the long
windows (SLO attainment, errors) read per-slice tallies of answered requests plus the list
of failures. Percentiles here are exact over a few seconds of values (numpy) — they decide
whether to warn, they are not reported figures (those come from the HDR histograms in
llmtop.metrics).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from llmtop.config import SloConfig
from llmtop.events import (
    OUT_OF_FILES_PREFIX,
    WORKER_EXIT_PREFIX,
    ActiveRequest,
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    counter_rise,
    itl_anchors,
)
from llmtop.metrics.slo import grouped_itl_within


@dataclass(slots=True, eq=False)
class Finished:
    """What the detectors keep of one finished request (not to be changed once made; not
    frozen: a frozen dataclass's ``__init__`` costs several times as much, once per
    request)."""

    t_end: float
    t_start: float
    outcome: str
    status: int
    ttft_s: float | None
    e2e_s: float
    itl_missed: bool
    """Its own ITL P95 broke the SLO's limit (:func:`itl_missed`; never without a
    limit or without ITL samples)."""
    tokens: int
    prompt_tokens: int | None
    offsets: tuple[float, ...]
    """Its content chunks' times, seconds from ``t_start`` (the record's)."""
    upstream_unreachable: bool

    @property
    def chunk_t(self) -> np.ndarray:
        """Unix time of every content chunk (float64; made when asked: most requests are
        never looked at chunk by chunk)."""
        return self.t_start + np.asarray(self.offsets, dtype=float)

    @property
    def t_first(self) -> float | None:
        """When the first token reached the client (the end of its prefill, seen here)."""
        return None if self.ttft_s is None else self.t_start + self.ttft_s


@dataclass(slots=True)
class Tally:
    """Answered (outcome ok) requests that ended in one slice of time, how many of them
    were streamed, and how many met each latency SLO; and the cancelled requests that had
    already missed each one (their clients gave up on a slow server: judged and failed, as
    in the metrics). TTFT and ITL apply to streamed answers only (a non-streamed one has
    no first token and no pace of tokens: :mod:`llmtop.metrics.slo`), so ``ok_ttft`` and
    ``ok_itl`` are out of ``streamed``, ``ok_e2e`` out of ``answered``."""

    t: float
    answered: int = 0
    streamed: int = 0
    ok_ttft: int = 0
    ok_itl: int = 0
    ok_e2e: int = 0
    gave_up_ttft: int = 0
    gave_up_itl: int = 0
    gave_up_e2e: int = 0


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that ended in error or timeout."""

    t_end: float
    outcome: str
    status: int
    upstream_unreachable: bool
    out_of_files: bool = False
    """The proxy's own 502: its process had no file descriptor for the upstream socket."""
    worker_lost: bool = False
    """Lost with a ``--workers`` worker that exited: WORKER_DOWN's, not the engine's."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One periodic reading of the proxy's open requests (and the engine's queue)."""

    t: float
    in_flight: int
    waiting: float
    """The engine's queue when a fresh engine reading exists, else the proxy's requests
    without a first token (queued or in prefill)."""
    streaming: int
    oldest_waiting_s: float
    proxy_waiting: int = 0
    """This proxy's open requests without a first token (never more than ``in_flight``)."""
    engine_waiting: float | None = None
    """The engine's queue from a fresh reading (all its clients', not only this proxy's
    requests), else None."""
    served: int = 0
    """This proxy's open requests the engine is answering (a first token or byte seen)."""


def _p(values: Iterable[float] | np.ndarray, q: float) -> float | None:
    arr = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def itl_missed(records: Sequence[RequestRecord], limit: float) -> npt.NDArray[np.bool_]:
    """Per record: whether its own ITL P95 is above ``limit`` (+
    :data:`~llmtop.metrics.slo.FLOAT_SLACK_S`) by the SLO's rule, so SLO_ITL judges a
    request as the snapshot's attainment does (:func:`~llmtop.metrics.slo.request_itl_p95`:
    the HDR rank over its ITL samples, not numpy's interpolation, which judged 20-token
    streams with one 0.5 s stall each a miss of a 50 ms limit the rank rule passes). The
    same samples (a chunk of k tokens gives k samples of g/k, g its time since the previous
    chunk that carried tokens or the first chunk; a chunk without a count 1, k <= 0 none;
    none of a non-streamed answer), counted for a whole batch by
    :func:`~llmtop.metrics.slo.grouped_itl_within` instead of sorted record by record
    (numpy's fixed cost per call, paid once a batch: a firehose's batches hold hundreds)."""
    n = len(records)
    lens = [len(r.chunk_offsets_s) if r.stream else 0 for r in records]
    total = sum(lens)
    if total < 2:
        return np.zeros(n, dtype=bool)
    lens_a = np.array(lens, dtype=np.int64)
    offs = np.fromiter(itertools.chain.from_iterable(
        r.chunk_offsets_s for r in records if r.stream), np.float64, total)
    toks: list[int] | None = None
    at = 0
    for r, m in zip(records, lens, strict=True):
        t = r.chunk_tokens
        if m and (len(t) > m or t.count(1) != len(t)):
            if toks is None:
                toks = [1] * total
            toks[at:at + min(len(t), m)] = t[:m]
        at += m
    inside = np.ones(total, dtype=bool)  # a chunk with an earlier one in its record
    inside[(np.cumsum(lens_a) - lens_a)[lens_a > 0]] = False
    hp = inside[1:]
    if toks is None:
        gaps = np.diff(offs)[hp]
        k = np.ones(len(gaps), dtype=np.int64)
    else:
        toks_a = np.array(toks, dtype=np.int64)
        anchor = itl_anchors(toks_a, ~inside)  # a 0-token chunk takes no time
        gaps = (offs[1:] - (offs[:-1] if anchor is None else offs[anchor]))[hp]
        k = toks_a[1:][hp]
    rec = np.repeat(np.arange(n, dtype=np.int64), lens_a)[1:][hp]
    missed: npt.NDArray[np.bool_] = ~grouped_itl_within(
        rec, np.divide(gaps, np.maximum(k, 1)), k, n, limit)
    return missed


def is_unreachable(rec: RequestRecord) -> bool:
    """The proxy could not connect to the upstream for this request: refused (its 502) or
    the connect timed out (its 504 — a host that drops connection attempts is as down as
    one that refuses them; QA: such an outage read as QUEUEING and as ERRORS "timeouts
    point at overload", never UPSTREAM_DOWN)."""
    return rec.upstream_unreachable


class Signals:
    """Rolling state: ``on_events`` is a bus subscriber, ``sample`` is called each tick.

    ``slo``: the latency targets answered requests are tallied against;
    ``keep_s``: how long finished requests themselves are kept (the short windows);
    ``tally_s``: how long tallies and failures are kept (the long windows), in slices of
    ``slice_s``; ``horizon_s``: how long samples, engine readings and baselines are kept;
    ``engine_fresh_s``: an engine reading older than this is not used for the queue.
    """

    def __init__(self, slo: SloConfig | None = None, *, keep_s: float = 30.0,
                 tally_s: float = 60.0, slice_s: float = 1.0, horizon_s: float = 330.0,
                 engine_fresh_s: float = 5.0) -> None:
        self.slo = slo if slo is not None else SloConfig()
        self.keep_s = keep_s
        self.tally_s = tally_s
        self.slice_s = slice_s
        self.horizon_s = horizon_s
        self.engine_fresh_s = engine_fresh_s
        self.finished: deque[Finished] = deque()
        self.tallies: deque[Tally] = deque()
        self.failures: deque[Failure] = deque()
        self.prompts: deque[int] = deque(maxlen=1000)
        """Prompt lengths (tokens) of the latest requests that reported one."""
        self.samples: deque[Sample] = deque()
        self.engine: EngineReading | None = None
        self.engine_history: deque[EngineReading] = deque()
        self.gpus: dict[int, GpuReading] = {}
        self.gpu_history: dict[int, deque[GpuReading]] = {}
        """Per GPU index, its readings of the last ``keep_s`` (and the one in effect at its
        start): what :meth:`gpu_mean` averages."""
        self.first_tokens: deque[tuple[float, float]] = deque()
        """(unix time of the first token, TTFT) of streamed requests: noted by ``sample``
        when it first sees a stream's first token, else from its record (one that started
        and ended between two samples) — so TTFT p95 follows first tokens as they come,
        not answers as they end (a 10-minute answer's TTFT was 10 minutes late)."""
        self._ttft_noted: set[str] = set()
        """Open requests whose first token ``sample`` noted (their records add none)."""
        self.ttft_p95_history: deque[tuple[float, float]] = deque()
        self.itl_p50_history: deque[tuple[float, float]] = deque()
        self._memo: dict[tuple[str, float, float], Any] = {}
        """Window views computed during the current tick (cleared by ``sample``)."""
        self.last_answer: float | None = None
        """When the engine last answered one of the finished requests (the latest end of
        one that had a first token, was answered, or was refused by the engine with a 4xx
        other than the proxy's 499): kept as the records come, so the stall check need not
        walk every request of its window each tick (at 2,000 requests/s that walk was a
        quarter of the detectors' tick)."""

    # -- input ---------------------------------------------------------------------------

    def on_events(self, batch: Iterable[Event]) -> None:
        records: list[RequestRecord] = []
        for ev in batch:
            if isinstance(ev, RequestRecord):
                records.append(ev)
            elif isinstance(ev, EngineReading):
                self.engine = ev
                self.engine_history.append(ev)
            elif isinstance(ev, GpuReading):
                self.gpus[ev.index] = ev
                self.gpu_history.setdefault(ev.index, deque()).append(ev)
        if records:
            limit = self.slo.itl_p95_s
            missed = [False] * len(records) if limit is None else \
                itl_missed(records, limit).tolist()
            for ev, miss in zip(records, missed, strict=True):
                self._on_record(ev, miss)

    def _on_record(self, ev: RequestRecord, itl_miss: bool) -> None:
        t_end = ev.t_start + ev.e2e_s
        unreachable = is_unreachable(ev)
        f = Finished(
            t_end=t_end,
            t_start=ev.t_start,
            outcome=ev.outcome,
            status=ev.status,
            # a non-streamed answer arrives whole: its TTFT is its E2E, not a first token's
            # latency (the metrics leave it out of TTFT and its objective too)
            ttft_s=ev.ttft_s if ev.stream else None,
            e2e_s=ev.e2e_s,
            itl_missed=itl_miss,
            tokens=ev.completion_tokens or 0,
            prompt_tokens=ev.prompt_tokens,
            offsets=ev.chunk_offsets_s,
            upstream_unreachable=unreachable,
        )
        self.finished.append(f)
        if (f.ttft_s is not None or ev.outcome == "ok" or (
                400 <= ev.status < 500 and ev.status != 499)) and (
                self.last_answer is None or t_end > self.last_answer):
            self.last_answer = t_end
        if ev.id in self._ttft_noted:
            self._ttft_noted.discard(ev.id)
        elif f.ttft_s is not None:
            self.first_tokens.append((ev.t_start + f.ttft_s, f.ttft_s))
        if ev.prompt_tokens:
            self.prompts.append(ev.prompt_tokens)
        if ev.outcome in ("error", "timeout"):
            error = ev.error or ""
            self.failures.append(Failure(
                t_end, ev.outcome, ev.status, unreachable,
                ev.status == 502 and error.startswith(OUT_OF_FILES_PREFIX),
                error.startswith(WORKER_EXIT_PREFIX)))
        elif ev.outcome == "ok":
            slo = self.slo
            tally = self._tally_for(t_end)
            tally.answered += 1
            if ev.stream:  # TTFT and ITL apply to streamed answers only
                tally.streamed += 1
                tally.ok_ttft += f.ttft_s is not None and (
                    slo.ttft_s is None or f.ttft_s <= slo.ttft_s)
                tally.ok_itl += not itl_miss  # a one-token answer has no ITL to miss
            tally.ok_e2e += slo.e2e_s is None or f.e2e_s <= slo.e2e_s
        elif ev.outcome == "cancelled":
            # judged on each objective it had already broken, as llmtop.metrics.slo does:
            # TTFT over the limit, or no first token yet past it; ITL p95 so far; E2E so far
            slo = self.slo
            waited = f.e2e_s if f.ttft_s is None else f.ttft_s
            ttft = slo.ttft_s is not None and ev.stream and waited > slo.ttft_s
            e2e = slo.e2e_s is not None and f.e2e_s > slo.e2e_s
            if ttft or itl_miss or e2e:
                tally = self._tally_for(t_end)
                tally.gave_up_ttft += ttft
                tally.gave_up_itl += itl_miss
                tally.gave_up_e2e += e2e

    def _tally_for(self, t: float) -> Tally:
        start = (t // self.slice_s) * self.slice_s
        tallies = self.tallies
        if not tallies or start > tallies[-1].t:
            tallies.append(Tally(start))
            return tallies[-1]
        for i in range(len(tallies) - 1, -1, -1):  # late records: rare, near the end
            if tallies[i].t == start:
                return tallies[i]
            if tallies[i].t < start:
                tallies.insert(i + 1, Tally(start))
                return tallies[i + 1]
        tallies.appendleft(Tally(start))
        return tallies[0]

    def sample(self, now: float, active: Mapping[str, ActiveRequest], now_ns: int) -> Sample:
        # a non-streamed request has no first token until its whole answer is there: it
        # is generating, not necessarily queued, so it is no evidence of a queue (QA: three
        # 1.5 s non-streamed Ollama requests raised QUEUEING against an idle engine)
        actives = list(active.values())
        waiting = [a for a in actives if a.first_token_ns is None and a.stream]
        self._note_first_tokens(actives, now, now_ns)
        oldest = max(((now_ns - a.t0_ns) / 1e9 for a in waiting), default=0.0)
        engine_waiting = None
        if self.engine is not None and now - self.engine.t < self.engine_fresh_s:
            engine_waiting = self.engine.waiting
        s = Sample(
            t=now,
            in_flight=len(active),
            waiting=float(engine_waiting if engine_waiting is not None else len(waiting)),
            streaming=len(active) - len(waiting),
            oldest_waiting_s=oldest,
            proxy_waiting=len(waiting),
            engine_waiting=None if engine_waiting is None else float(engine_waiting),
            served=sum(1 for a in actives if a.first_token_ns is not None),
        )
        self.samples.append(s)
        self._trim(now)
        self._memo.clear()
        return s

    def _note_first_tokens(self, actives: list[ActiveRequest], now: float, now_ns: int
                           ) -> None:
        noted, firsts = self._ttft_noted, self.first_tokens
        for a in actives:
            ft = a.first_token_ns
            if ft is not None and a.stream and a.id not in noted:
                noted.add(a.id)
                firsts.append((now - (now_ns - ft) / 1e9, (ft - a.t0_ns) / 1e9))
        if len(noted) > 2 * len(actives) + 1024:  # records that never came: forget them
            open_ids = {a.id for a in actives}
            noted.intersection_update(open_ids)

    def _trim(self, now: float) -> None:
        keep = now - self.keep_s
        while self.first_tokens and self.first_tokens[0][0] < keep:
            self.first_tokens.popleft()
        while self.finished and self.finished[0].t_end < keep:
            self.finished.popleft()
        keep = now - self.tally_s
        while self.tallies and self.tallies[0].t + self.slice_s < keep:
            self.tallies.popleft()
        while self.failures and self.failures[0].t_end < keep:
            self.failures.popleft()
        cut_gpu = now - self.keep_s
        for gh in self.gpu_history.values():  # the reading in effect at the cut stays
            while len(gh) > 1 and gh[1].t <= cut_gpu:
                gh.popleft()
        cut = now - self.horizon_s
        while self.samples and self.samples[0].t < cut:
            self.samples.popleft()
        while self.engine_history and self.engine_history[0].t < cut:
            self.engine_history.popleft()
        for hist in (self.ttft_p95_history, self.itl_p50_history):
            while len(hist) > self.KEEP_BASELINES and hist[0][0] < cut:
                hist.popleft()

    # -- views over a window -------------------------------------------------------------

    def finished_in(self, now: float, window_s: float) -> list[Finished]:
        """Requests that ended in the window, oldest first (computed once per tick)."""
        key = ("finished", now, window_s)
        got: list[Finished] | None = self._memo.get(key)
        if got is None:
            cut = now - window_s
            got = []
            older = 0
            # records come in completion order: walk back from the newest, and stop once
            # a run of them is older than the window (tolerating small inversions)
            for f in reversed(self.finished):
                if f.t_end >= cut:
                    got.append(f)
                    older = 0
                else:
                    older += 1
                    if older > 64:
                        break
            got.reverse()
            self._memo[key] = got
        return got

    def serving_since(self, t: float, samples: Iterable[Sample]) -> bool:
        """Whether the engine was seen serving since ``t``: one of ``samples`` had a request
        of this proxy being answered, or a first token or an answer came."""
        return (any(s.served > 0 for s in samples)
                or any(ft >= t for ft, _ in reversed(self.first_tokens))
                or any(f.outcome == "ok" and f.t_end >= t for f in reversed(self.finished)))

    def samples_in(self, now: float, window_s: float) -> list[Sample]:
        cut = now - window_s
        return [s for s in self.samples if s.t >= cut]

    def ttft_p95(self, now: float, window_s: float) -> float | None:
        """TTFT p95 of the streamed requests whose first token came in the window."""
        cut = now - window_s
        return _p((v for t, v in self.first_tokens if t >= cut), 95)

    KEEP_BASELINES = 30
    """Baseline entries kept even when older than the horizon."""

    MAX_GAPS = 20_000
    """gaps_in keeps the latest requests' gaps up to about this many (bounded cost)."""

    def gaps_in(self, now: float, window_s: float) -> np.ndarray:
        """Chunk gaps of the requests that finished in the window, the latest ~MAX_GAPS
        of them (once per tick)."""
        key = ("gaps", now, window_s)
        got: np.ndarray | None = self._memo.get(key)
        if got is None:
            picked: list[Finished] = []
            total = 0
            for f in reversed(self.finished_in(now, window_s)):
                m = len(f.offsets)
                if m > 1:
                    picked.append(f)
                    total += m
                    if total - len(picked) >= self.MAX_GAPS:
                        break
            if picked:
                # every picked request's chunk times (unix, as chunk_t makes them) in one
                # array, then the differences that stay inside a request
                lens = np.array([len(f.offsets) for f in picked], dtype=np.int64)
                offs = np.fromiter(itertools.chain.from_iterable(f.offsets for f in picked),
                                   np.float64, total)
                times = offs + np.repeat(np.array([f.t_start for f in picked]), lens)
                got = np.delete(np.diff(times), np.cumsum(lens)[:-1] - 1)
            else:
                got = np.empty(0)
            self._memo[key] = got
        return got

    def gpu_mean(self, index: int, now: float, window_s: float, name: str) -> float | None:
        """GPU ``index``'s mean ``name`` (a :class:`~llmtop.events.GpuReading` field) over
        the readings in effect in the window: the last one at or before its start and every
        later one (readings without the field left out; None: none has it)."""
        hist = self.gpu_history.get(index)
        if not hist:
            return None
        cut = now - window_s
        vals: list[float] = []
        for g in reversed(hist):
            v = getattr(g, name)
            if v is not None:
                vals.append(float(v))
            if g.t <= cut:
                break
        return sum(vals) / len(vals) if vals else None

    def itl_p50(self, now: float, window_s: float) -> float | None:
        key = ("itl_p50", now, window_s)
        if key not in self._memo:
            self._memo[key] = _p(self.gaps_in(now, window_s), 50)
        got: float | None = self._memo[key]
        return got

    def output_tps(self, now: float, window_s: float) -> float:
        return sum(f.tokens for f in self.finished_in(now, window_s)) / window_s

    def remember_baselines(self, now: float, window_s: float, *, calm: bool,
                           gaps_calm: bool = True) -> None:
        """Add this window's TTFT p95 (from ≥ 5 streamed answers: a non-streamed one has no
        first token and is not one of the five; and only when ``calm``: nothing was queued,
        so it is what the service does unloaded) and chunk-gap p50
        (from ≥ 50 gaps, and only when ``gaps_calm``: the monitor passes False while
        BANDWIDTH holds, so the baseline never learns the slowdown that warning reports —
        a memory-bound stretch longer than the horizon became its own baseline, and the
        warning cleared after 5.5 minutes with nothing changed) to the baseline histories."""
        if calm:  # the streamed answers' TTFTs (a non-streamed one has none: None)
            ttfts = [f.ttft_s for f in self.finished_in(now, window_s)
                     if f.outcome == "ok" and f.ttft_s is not None]
            if len(ttfts) >= 5:  # five streamed answers, not five answers
                p = _p(ttfts, 95)
                if p is not None:
                    self.ttft_p95_history.append((now, p))
        if gaps_calm and self.gaps_in(now, window_s).size >= 50:
            q = self.itl_p50(now, window_s)
            if q is not None:
                self.itl_p50_history.append((now, q))

    def ttft_baseline(self) -> float | None:
        """What the service does unloaded: a low (10th) percentile of the calm windows'
        TTFT p95s in the horizon — low, but not the one luckiest window. The latest calm
        windows are kept past the horizon, so a long saturation keeps its baseline."""
        return _p((v for _, v in self.ttft_p95_history), 10)

    def itl_baseline(self) -> float | None:
        """A low (10th) percentile of the window chunk-gap p50s seen in the horizon (none
        taken while BANDWIDTH holds; the latest ones are kept past the horizon, as the
        TTFT baseline's are)."""
        return _p((v for _, v in self.itl_p50_history), 10)

    def slo_attainment(self, now: float, window_s: float, which: str
                       ) -> tuple[float | None, int]:
        """Share of the requests judged on one SLO (``ttft``, ``itl``, ``e2e``) in the
        window (to the slice) that met it, and how many were judged: those answered
        (outcome ok; for TTFT and ITL the streamed ones: a non-streamed answer is judged on
        E2E only, as in :mod:`llmtop.metrics.slo`) and those cancelled after missing it
        (:meth:`gave_up`). Failed requests are left to ERRORS/UPSTREAM_DOWN, so a latency
        warning is about latency."""
        slo = self.slo
        if {"ttft": slo.ttft_s, "itl": slo.itl_p95_s, "e2e": slo.e2e_s}[which] is None:
            return None, 0
        n = met = 0
        for t in self.tallies_in(now, window_s):
            n += (t.answered if which == "e2e" else t.streamed) + {
                "ttft": t.gave_up_ttft, "itl": t.gave_up_itl, "e2e": t.gave_up_e2e}[which]
            met += {"ttft": t.ok_ttft, "itl": t.ok_itl, "e2e": t.ok_e2e}[which]
        return (met / n if n else None), n

    def gave_up(self, now: float, window_s: float, which: str) -> int:
        """Requests cancelled in the window (to the slice) after missing one SLO."""
        return sum({"ttft": t.gave_up_ttft, "itl": t.gave_up_itl,
                    "e2e": t.gave_up_e2e}[which] for t in self.tallies_in(now, window_s))

    def tallies_in(self, now: float, window_s: float) -> list[Tally]:
        cut = now - window_s
        return [t for t in self.tallies if t.t + self.slice_s > cut]

    def answered_in(self, now: float, window_s: float) -> int:
        """Requests answered (outcome ok) in the window, to the slice."""
        return sum(t.answered for t in self.tallies_in(now, window_s))

    def failures_in(self, now: float, window_s: float) -> list[Failure]:
        cut = now - window_s
        return [f for f in self.failures if f.t_end >= cut]

    def kv_peak(self, now: float, window_s: float) -> float | None:
        """The engine's highest KV-cache usage among its readings of the last
        ``window_s`` (None: no reading had one)."""
        cut = now - window_s
        seen = [e.kv_cache_usage for e in self.engine_history
                if e.t >= cut and e.kv_cache_usage is not None]
        return max(seen) if seen else None

    def preemptions_delta(self, now: float, window_s: float) -> float:
        cut = now - window_s
        hist = [e for e in self.engine_history if e.t >= cut and e.preemptions is not None]
        if len(hist) < 2:
            return 0.0
        # the counter's rises, reading to reading: an engine restart resets it to 0, and
        # last − first then undercounts (or reads 0) what happened in the window
        counts = [float(e.preemptions or 0) for e in hist]
        return sum(counter_rise(a, b) for a, b in pairwise(counts))
