"""Turning a batch of finished requests into histogram counts and counters, vectorised.

What each request contributes (definitions in ``shared/docs/domain.md``):

- TTFT, ITL and chunk gaps from **every streamed** request that produced them (a
  cancelled or broken stream's first token is still what its client saw). A non-streamed
  response (``stream`` false) arrives whole: its TTFT is its E2E and says nothing about
  first-token latency or the pace of tokens, so it adds no TTFT, ITL, chunk-gap or TPOT
  sample (its record keeps ``ttft_s``, what the client saw) and the TTFT, ITL and TPOT
  objectives do not apply to it (see :mod:`llmtop.metrics.slo`);
- ITL: a chunk with k > 0 tokens gives k samples of g/k (one value of weight k), g its
  time since the previous chunk that carried tokens, or since its request's first chunk;
  a chunk with k <= 0 gives none and takes no time (:func:`~llmtop.events.itl_anchors`).
  A chunk-gap sample is every chunk's gap to the chunk before it, whatever its count;
- TPOT and E2E only from requests whose outcome is ``ok`` (an aborted request's E2E is
  not a completion time);
- each latency sample to three series: the system, the request's user and its model —
  except chunk gaps, which go to the system only (per-user rows show TTFT, ITL, TPOT and
  E2E; chunk gaps per user would double the per-token data kept for nothing shown).

A long stream's ITL and chunk-gap samples are mostly filed while it streams, from the
:class:`~llmtop.events.ChunkSlice` events the relay publishes (:func:`slice_table`); its
record then adds those of the chunks no slice carried (``live_filed``), and its ITL
objective is still judged over all its chunks.

Per-record Python work is a handful of attribute reads; bucketing, the per-request ITL
P95 check, SLO checks and table building are numpy calls over the whole batch (about
forty of them, whatever its size: the aggregator queues records and files them in
batches).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from llmtop.events import RequestRecord, itl_anchors
from llmtop.metrics.hdr import COUNTS_LEN, bucket_index, seconds_to_us
from llmtop.metrics.slo import FLOAT_SLACK_S, Slo, grouped_itl_within
from llmtop.metrics.table import SERIES_SPAN, CountTable

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

METRICS: Final = ("ttft", "itl", "chunk_gap", "tpot", "e2e")
M_TTFT, M_ITL, M_GAP, M_TPOT, M_E2E = range(5)

COUNTERS: Final = (
    "requests", "ok", "errors", "cancelled", "timeouts",
    "output_tokens", "output_tokens_done", "input_tokens", "slo_met", "good_tokens",
    "slo_judged",
)
"""Counter columns. ``output_tokens`` is attributed as tokens stream (live, for TPS);
``output_tokens_done`` when the request finishes (monotonic, for Prometheus);
``slo_judged`` counts the requests SLO attainment is taken over (see :mod:`llmtop.metrics.slo`:
all but those the client cancelled while still within every objective)."""
(C_REQ, C_OK, C_ERR, C_CANC, C_TMO, C_OUT, C_OUT_DONE, C_IN, C_MET, C_GOOD, C_JUDGED) = range(
    len(COUNTERS)
)
_OUTCOME_COL: Final = {"ok": C_OK, "error": C_ERR, "cancelled": C_CANC, "timeout": C_TMO}
_METRIC_ORDER: Final = np.array([M_GAP, M_TTFT, M_ITL, M_TPOT, M_E2E], dtype=np.int64)
"""The order of the latency samples in a batch: chunk gaps (system only) first."""


@dataclass(slots=True)
class Batch:
    """What one batch of records adds."""

    table: CountTable
    counters: I64
    met: npt.NDArray[np.bool_]
    judged: npt.NDArray[np.bool_]
    concurrency: I64
    good_tokens: F64
    e2e_s: F64
    clamped: int


def output_tokens(r: RequestRecord) -> int:
    """The request's output tokens: the engine's count, else the sum over its chunks."""
    if r.completion_tokens is not None:
        return r.completion_tokens
    return sum(r.chunk_tokens)


def ingest(
    records: Sequence[RequestRecord],
    user_series: Sequence[int],
    model_series: Sequence[int],
    live_remainder: Sequence[int],
    slo: Slo,
    shape: tuple[int, int],
    ttft_filed: Sequence[bool] | None = None,
    live_filed: Sequence[int] | None = None,
    before_start: Sequence[int] | None = None,
    *,
    live_anchor: Sequence[int] | None = None,
) -> Batch:
    """Build one batch's table and counters.

    ``user_series[i]``/``model_series[i]`` are record i's series ids; ``live_remainder[i]``
    its output tokens not yet attributed live (see :class:`~llmtop.metrics.aggregator.Aggregator`);
    ``ttft_filed[i]``: its TTFT sample was filed live, when its first token was seen
    (:func:`ttft_table`), so it adds none now (its TTFT objective is still judged here);
    ``live_filed[i]``: its first ``live_filed[i]`` chunks' ITL and chunk-gap samples were
    filed live, from slices (:func:`slice_table`), so only the gaps that end at a later
    chunk add samples now (the first chunk gap: from the last chunk filed live; an ITL gap
    runs from the previous chunk that carried tokens, filed live or not). Its ITL objective
    is still judged over every chunk. ``live_anchor[i]`` (with ``live_filed``): the chunk,
    among those filed live, the live samples' last ITL gap ended at (the last that carried
    tokens by the live weights, or chunk 0): its first ITL gap after them runs from there
    even where its own counts say otherwise of the chunks filed live (those weights can
    differ from its counts, scaled to the usage), so no time is counted twice or never.

    ``before_start[i]`` ≥ 0: record i began before the aggregator started (a replay of a
    recording started mid-traffic: :meth:`~llmtop.metrics.aggregator.Aggregator.carry_in`)
    and had streamed that many output tokens by then. Rates over the aggregator's span do
    not count them: its ``output_tokens_done`` and ``good_tokens`` are the rest of its
    output, and its ``input_tokens`` none (its prompt went upstream before the start).
    −1: it began inside the span. The capacity estimate's good tokens (``Batch.good_tokens``)
    stay the whole request's: they are tokens per request, not per second of the span.
    """
    n = len(records)
    nan = float("nan")
    ttft_l: list[float] = []
    streamed_l: list[bool] = []
    e2e_l: list[float] = []
    tpot_l: list[float] = []
    ok_l: list[bool] = []
    canc_l: list[bool] = []
    col_l: list[int] = []
    out_l: list[int] = []
    in_l: list[int] = []
    conc_l: list[int] = []
    offs_parts: list[tuple[float, ...]] = []
    toks_parts: list[tuple[int, ...]] = []
    lens_l: list[int] = []
    outcome_col = _OUTCOME_COL
    one_token = True  # every chunk carried one token (the usual case): no token array
    for r in records:
        t = r.ttft_s
        ttft_l.append(nan if t is None else t)
        streamed = r.stream
        streamed_l.append(streamed)
        e2e_l.append(r.e2e_s)
        outcome = r.outcome
        ok_l.append(outcome == "ok")
        canc_l.append(outcome == "cancelled")
        col_l.append(outcome_col.get(outcome, C_ERR))
        t = r.tpot_s()
        tpot_l.append(nan if t is None else t)
        out_l.append(output_tokens(r))
        in_l.append(r.prompt_tokens or 0)
        conc_l.append(r.concurrency_at_start)
        offs = r.chunk_offsets_s
        m = len(offs)
        if m >= 2 and streamed:
            toks = r.chunk_tokens
            if len(toks) != m:
                toks = (*toks[:m], *((1,) * (m - len(toks))))
            offs_parts.append(offs)
            toks_parts.append(toks)
            lens_l.append(m)
            if one_token and toks.count(1) != m:
                one_token = False
        else:
            lens_l.append(0)
    ttft = np.array(ttft_l, dtype=np.float64)
    e2e = np.array(e2e_l, dtype=np.float64)
    tpot = np.array(tpot_l, dtype=np.float64)
    streamed_a = np.array(streamed_l, dtype=bool)
    ok = np.array(ok_l, dtype=bool)
    cancelled = np.array(canc_l, dtype=bool)
    conc = np.array(conc_l, dtype=np.int64)
    lens = np.array(lens_l, dtype=np.int64)
    rec_all = np.arange(n, dtype=np.int64)
    rows = np.zeros((n, shape[1]), dtype=np.int64)
    rows[:, C_REQ] = 1
    rows[rec_all, col_l] = 1
    rows[:, C_OUT] = live_remainder
    rows[:, C_OUT_DONE] = out_l
    rows[:, C_IN] = in_l
    whole_good: npt.NDArray[np.int64] | None = None
    if before_start is not None:
        pre = np.asarray(before_start, dtype=np.int64)
        carried = pre >= 0
        if carried.any():
            whole_good = rows[:, C_OUT_DONE].copy()
            rows[carried, C_OUT_DONE] = np.maximum(whole_good[carried] - pre[carried], 0)
            rows[carried, C_IN] = 0

    # chunk gaps and ITL samples of every record in one array
    total = int(lens.sum())
    offs_a = np.fromiter(itertools.chain.from_iterable(offs_parts), np.float64, total)
    toks_a = np.ones(total, dtype=np.int64) if one_token else \
        np.fromiter(itertools.chain.from_iterable(toks_parts), np.int64, total)
    has_prev = np.ones(total, dtype=bool)  # a previous chunk in the same record
    nonempty = lens[lens > 0]
    has_prev[np.cumsum(nonempty) - nonempty] = False
    gap_rec = np.repeat(rec_all, lens)[has_prev]
    hp = has_prev[1:]
    gaps = (offs_a[1:] - offs_a[:-1])[hp]
    k = toks_a[1:][hp]
    # a chunk's ITL gap runs from its anchor: the previous chunk that carried tokens, or
    # its record's first (the chunk gap unless a 0-token chunk sits between)
    anchor = None if one_token else itl_anchors(toks_a, ~has_prev)
    itl = np.divide(gaps if anchor is None else (offs_a[1:] - offs_a[anchor])[hp],
                    np.maximum(k, 1))

    # SLO pass/fail; ``within``: no objective broken so far (what a cancelled request is
    # judged by: TTFT, its ITL p95 and E2E up to the cancel, not its partial TPOT). TTFT
    # applies to streamed requests only (a non-streamed one has no ITL sample, nor TPOT).
    has_ttft = ~np.isnan(ttft) & streamed_a
    met = ok.copy()
    within = np.ones(n, dtype=bool)
    if slo.ttft_s is not None:
        ttft_ok = has_ttft & (ttft <= slo.ttft_s)
        met &= ttft_ok | ~streamed_a
        within &= ttft_ok | ~streamed_a | (np.isnan(ttft) & (e2e <= slo.ttft_s))
    if slo.e2e_s is not None:
        e2e_ok = e2e <= slo.e2e_s
        met &= e2e_ok
        within &= e2e_ok
    if slo.tpot_s is not None:
        met &= np.isnan(tpot) | (tpot <= slo.tpot_s + FLOAT_SLACK_S)
    if slo.itl_p95_s is not None:
        itl_ok = grouped_itl_within(gap_rec, itl, k, n, slo.itl_p95_s)
        met &= itl_ok
        within &= itl_ok
    judged = ~cancelled | ~within
    if live_filed is not None and any(live_filed):
        # only the gaps ending at a chunk no slice filed (a chunk's index in its record)
        pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        filed_a = np.asarray(live_filed, dtype=np.int64)
        live_part = pos < np.repeat(filed_a, lens)
        if live_anchor is not None:
            itl = _itl_after_live(itl, offs_a, toks_a, k, anchor, has_prev, lens, filed_a,
                                  np.asarray(live_anchor, dtype=np.int64), live_part)
        fresh = ~live_part[has_prev]
        gaps, gap_rec, k, itl = gaps[fresh], gap_rec[fresh], k[fresh], itl[fresh]
    rows[:, C_JUDGED] = judged
    rows[:, C_MET] = met
    good_i = np.where(met, rows[:, C_OUT_DONE], 0)
    rows[:, C_GOOD] = good_i
    if whole_good is not None:
        good_i = np.where(met, whole_good, 0)

    # latency samples, chunk gaps first (they go to the system only): value (seconds),
    # metric, weight, record
    has_tpot = ok & ~np.isnan(tpot)
    itl_keep = k > 0
    k_itl = k[itl_keep]
    ttft_sample = has_ttft
    if ttft_filed is not None and any(ttft_filed):
        ttft_sample = has_ttft & ~np.asarray(ttft_filed, dtype=bool)
    vals = np.concatenate([gaps, ttft[ttft_sample], itl[itl_keep], tpot[has_tpot], e2e[ok]])
    counts = [len(gaps), int(ttft_sample.sum()), len(k_itl), int(has_tpot.sum()),
              int(ok.sum())]
    metric = np.repeat(_METRIC_ORDER, counts)
    rec = np.concatenate([gap_rec, rec_all[ttft_sample], gap_rec[itl_keep], rec_all[has_tpot],
                          rec_all[ok]])
    w = np.ones(len(vals), dtype=np.int64)
    w[counts[0] + counts[1]:counts[0] + counts[1] + counts[2]] = k_itl
    table, clamped = _samples_table(vals, metric, w, rec, counts[0], user_series, model_series)

    counters = np.zeros(shape, dtype=np.int64)
    counters[0] += rows.sum(axis=0)
    np.add.at(counters, np.asarray(user_series, dtype=np.int64), rows)
    np.add.at(counters, np.asarray(model_series, dtype=np.int64), rows)
    return Batch(table, counters, met, judged, conc, good_i.astype(np.float64), e2e, clamped)


def _itl_after_live(itl: F64, offs: F64, toks: I64, k: I64, anchor: I64 | None,
                    has_prev: npt.NDArray[np.bool_], lens: I64, filed: I64, live_anchor: I64,
                    live_part: npt.NDArray[np.bool_]) -> F64:
    """``itl`` (aligned with the gaps, by the records' own counts) with the gaps that end
    after the chunks filed live run from the live anchors (:func:`ingest`'s
    ``live_anchor``): unchanged (the same array) when every record's anchor is the one its
    own counts give, else recomputed with the same IEEE operations (one subtraction, then
    ``/ k``)."""
    starts = np.cumsum(lens) - lens
    sel = (filed > 0) & (filed <= lens) & (live_anchor >= 0) & (live_anchor < filed)
    if not sel.any():
        return itl
    at = starts[sel] + live_anchor[sel]  # the live anchor of each such record (a point)
    last = starts[sel] + filed[sel] - 1  # its last chunk filed live
    # the anchor its own counts give the first chunk after them (the point ``last`` + 1)
    own = last if anchor is None else anchor[np.minimum(last, len(anchor) - 1)]
    if np.array_equal(own, at):
        return itl
    marks = toks.copy()
    marks[live_part] = 0  # the chunks filed live: only their live anchor counts
    marks[at] = 1
    anchors = itl_anchors(marks, ~has_prev)
    if anchors is None:  # (cannot be: a live anchor differs from the chunk before)
        return itl
    return np.divide((offs[1:] - offs[anchors])[has_prev[1:]], np.maximum(k, 1))


def _samples_table(vals: F64, metric: I64, w: I64, rec: I64, n_gap: int,
                   user_series: Sequence[int], model_series: Sequence[int]
                   ) -> tuple[CountTable, int]:
    """Latency samples (seconds, metric, weight, the index of their request's series ids) as
    a table — the first ``n_gap`` (chunk gaps) to the system only, the others to the system,
    the user and the model — and how many values were clamped or dropped (NaN)."""
    clamped = 0
    bad = np.isnan(vals)
    if bad.any():
        clamped += int(bad.sum())
        n_gap -= int(bad[:n_gap].sum())
        keep = ~bad
        vals, metric, rec, w = vals[keep], metric[keep], rec[keep], w[keep]
    if not len(vals):
        return CountTable.empty(), clamped
    clamped += int((vals < 0).sum())
    us, out_of_range = seconds_to_us(np.maximum(vals, 0.0))
    clamped += out_of_range
    base = bucket_index(us) + metric * (SERIES_SPAN * COUNTS_LEN)
    b_fan, w_fan, r_fan = base[n_gap:], w[n_gap:], rec[n_gap:]
    us_series = np.asarray(user_series, dtype=np.int64)[r_fan]
    md_series = np.asarray(model_series, dtype=np.int64)[r_fan]
    keys = np.concatenate([base, b_fan + us_series * COUNTS_LEN,
                           b_fan + md_series * COUNTS_LEN])
    return CountTable.from_keys(keys, np.concatenate([w, w_fan, w_fan])), clamped


def slice_table(points_ns: I64, t0_ns: Sequence[int], lens: Sequence[int], tokens: I64,
                user_series: Sequence[int], model_series: Sequence[int],
                anchors_ns: Sequence[int] | None = None,
                ) -> tuple[CountTable, int]:
    """The chunk-gap and ITL samples of open streams' latest chunks (filed live, before
    their records: see :class:`~llmtop.events.ChunkSlice`), as :func:`ingest` builds them
    from a record: a chunk with k > 0 tokens gives k ITL samples of g/k (weight k), g its
    time since its stream's previous chunk that carried tokens (or its first chunk), to the
    system, its user and its model; a chunk with k <= 0 none (and the next one's g spans
    it); every chunk one chunk-gap sample (its gap to the chunk before) to the system. And
    how many values were clamped or dropped.

    Slice i is ``lens[i]`` consecutive points of ``points_ns`` (``perf_counter_ns`` times):
    the chunk before the slice when it has one (no sample of its own), then its chunks; its
    request's t0 is ``t0_ns[i]`` and its series ids ``user_series[i]``/``model_series[i]``.
    ``tokens`` holds each point's token count (a previous chunk's is not read).
    ``anchors_ns[i]`` is the ITL anchor of slice i's first point: the time of the stream's
    last chunk before the slice that carried tokens (or of its first chunk) — when it is not
    the chunk before (that one carried 0), the slice's first token-carrying chunk's ITL gap
    runs from it (None: every slice's first point is its own anchor). Times are taken to
    seconds as the record takes them (``(t - t0) / 1e9``) before the gaps are differenced,
    so a sample has the value, bit for bit, the record would have given it."""
    lens_a = np.asarray(lens, dtype=np.int64)
    total = int(lens_a.sum())
    if total < 2:
        return CountTable.empty(), 0
    n = len(lens_a)
    t0_a = np.asarray(t0_ns, dtype=np.int64)
    secs = (points_ns - np.repeat(t0_a, lens_a)) / 1e9
    has_prev = np.ones(total, dtype=bool)
    nonempty = lens_a[lens_a > 0]
    starts = np.cumsum(nonempty) - nonempty
    has_prev[starts] = False
    gap_rec = np.repeat(np.arange(n, dtype=np.int64), lens_a)[has_prev]
    hp = has_prev[1:]
    gaps = (secs[1:] - secs[:-1])[hp]
    k = tokens[1:][hp]
    anchor = itl_anchors(tokens, ~has_prev)
    base = secs
    if anchors_ns is not None:
        some = lens_a > 0
        anchor_a = np.asarray(anchors_ns, dtype=np.int64)[some]
        if (anchor_a != points_ns[starts]).any():  # a chunk before that carried 0 tokens
            base = secs.copy()
            base[starts] = (anchor_a - t0_a[some]) / 1e9
            if anchor is None:
                anchor = np.arange(total - 1, dtype=np.int64)
    itl = np.divide(gaps if anchor is None else (secs[1:] - base[anchor])[hp],
                    np.maximum(k, 1))
    keep = k > 0
    k_itl = k[keep]
    n_gap = len(gaps)
    vals = np.concatenate([gaps, itl[keep]])
    metric = np.repeat(np.array([M_GAP, M_ITL], dtype=np.int64), [n_gap, len(k_itl)])
    w = np.concatenate([np.ones(n_gap, dtype=np.int64), k_itl])
    rec = np.concatenate([gap_rec, gap_rec[keep]])
    return _samples_table(vals, metric, w, rec, n_gap, user_series, model_series)


def ttft_table(ttft_s: Sequence[float], user_series: Sequence[int],
               model_series: Sequence[int]) -> tuple[CountTable, int]:
    """TTFT samples of requests whose first token was just seen (filed live, before their
    records), each to the system, its user and its model; and how many were clamped."""
    vals = np.asarray(ttft_s, dtype=np.float64)
    bad = np.isnan(vals)
    clamped = int(bad.sum())
    keep = ~bad
    vals = vals[keep]
    if not len(vals):
        return CountTable.empty(), clamped
    clamped += int((vals < 0).sum())
    us, out_of_range = seconds_to_us(np.maximum(vals, 0.0))
    clamped += out_of_range
    base = bucket_index(us) + M_TTFT * (SERIES_SPAN * COUNTS_LEN)
    users = np.asarray(user_series, dtype=np.int64)[keep]
    models = np.asarray(model_series, dtype=np.int64)[keep]
    keys = np.concatenate([base, base + users * COUNTS_LEN, base + models * COUNTS_LEN])
    return CountTable.from_keys(keys), clamped
