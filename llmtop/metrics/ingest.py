"""Turning a batch of finished requests into histogram counts and counters, vectorised.

What each request contributes (definitions in ``shared/docs/domain.md``):

- TTFT, ITL and chunk gaps from **every** request that produced them (a cancelled or
  broken stream's first token is still what its client saw);
- TPOT and E2E only from requests whose outcome is ``ok`` (an aborted request's E2E is
  not a completion time);
- each latency sample to three series: the system, the request's user and its model —
  except chunk gaps, which go to the system only (per-user rows show TTFT, ITL, TPOT and
  E2E; chunk gaps per user would double the per-token data kept for nothing shown).

Per-record Python work is a handful of attribute reads; bucketing, per-request ITL P95,
SLO checks and table building are numpy calls over the whole batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from llmtop.events import RequestRecord
from llmtop.metrics.hdr import COUNTS_LEN, bucket_index, seconds_to_us
from llmtop.metrics.slo import Slo, grouped_itl_p95
from llmtop.metrics.table import SERIES_SPAN, CountTable

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

METRICS: Final = ("ttft", "itl", "chunk_gap", "tpot", "e2e")
M_TTFT, M_ITL, M_GAP, M_TPOT, M_E2E = range(5)

COUNTERS: Final = (
    "requests", "ok", "errors", "cancelled", "timeouts",
    "output_tokens", "output_tokens_done", "input_tokens", "slo_met", "good_tokens",
)
"""Counter columns. ``output_tokens`` is attributed as tokens stream (live, for TPS);
``output_tokens_done`` when the request finishes (monotonic, for Prometheus)."""
(C_REQ, C_OK, C_ERR, C_CANC, C_TMO, C_OUT, C_OUT_DONE, C_IN, C_MET, C_GOOD) = range(
    len(COUNTERS)
)
_OUTCOME_COL: Final = {"ok": C_OK, "error": C_ERR, "cancelled": C_CANC, "timeout": C_TMO}


@dataclass(slots=True)
class Batch:
    """What one batch of records adds."""

    table: CountTable
    counters: I64
    met: npt.NDArray[np.bool_]
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
) -> Batch:
    """Build one batch's table and counters.

    ``user_series[i]``/``model_series[i]`` are record i's series ids; ``live_remainder[i]``
    its output tokens not yet attributed live (see :class:`~llmtop.metrics.aggregator.Aggregator`).
    """
    n = len(records)
    ttft = np.full(n, np.nan)
    e2e = np.empty(n)
    tpot = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    rows = np.zeros((n, shape[1]), dtype=np.int64)
    conc = np.empty(n, dtype=np.int64)
    offs_parts: list[tuple[float, ...]] = []
    toks_parts: list[tuple[int, ...]] = []
    lens = np.zeros(n, dtype=np.int64)
    for i, r in enumerate(records):
        if r.ttft_s is not None:
            ttft[i] = r.ttft_s
        e2e[i] = r.e2e_s
        is_ok = r.outcome == "ok"
        ok[i] = is_ok
        t = r.tpot_s()
        if t is not None:
            tpot[i] = t
        out = output_tokens(r)
        row = rows[i]
        row[C_REQ] = 1
        row[_OUTCOME_COL.get(r.outcome, C_ERR)] = 1
        row[C_OUT] = live_remainder[i]
        row[C_OUT_DONE] = out
        row[C_IN] = r.prompt_tokens or 0
        conc[i] = r.concurrency_at_start
        offs = r.chunk_offsets_s
        m = len(offs)
        if m >= 2:
            toks = r.chunk_tokens
            if len(toks) != m:
                toks = (*toks[:m], *((1,) * (m - len(toks))))
            offs_parts.append(offs)
            toks_parts.append(toks)
            lens[i] = m
    out_tok = rows[:, C_OUT_DONE].astype(np.float64)

    # chunk gaps and ITL samples of every record in one array
    total = int(lens.sum())
    rec_of = np.repeat(np.arange(n, dtype=np.int64), lens)
    offs_a = np.fromiter(itertools.chain.from_iterable(offs_parts), np.float64, total)
    toks_a = np.fromiter(itertools.chain.from_iterable(toks_parts), np.int64, total)
    has_prev = np.ones(total, dtype=bool)  # a previous chunk in the same record
    nonempty = lens[lens > 0]
    has_prev[np.cumsum(nonempty) - nonempty] = False
    gap_rec = rec_of[has_prev]
    gaps = (offs_a - np.roll(offs_a, 1))[has_prev] if total else np.empty(0)
    k = toks_a[has_prev]
    itl = np.divide(gaps, np.maximum(k, 1))
    itl_p95 = grouped_itl_p95(gap_rec, itl, k, n)

    # SLO pass/fail
    met = ok.copy()
    if slo.ttft_s is not None:
        met &= ~np.isnan(ttft) & (ttft <= slo.ttft_s)
    if slo.e2e_s is not None:
        met &= e2e <= slo.e2e_s
    if slo.tpot_s is not None:
        met &= np.isnan(tpot) | (tpot <= slo.tpot_s)
    if slo.itl_p95_s is not None:
        met &= np.isnan(itl_p95) | (itl_p95 <= slo.itl_p95_s)
    rows[:, C_MET] = met
    rows[:, C_GOOD] = np.where(met, rows[:, C_OUT_DONE], 0)

    # latency samples: (metric, value seconds, weight, record)
    rec_all = np.arange(n, dtype=np.int64)
    has_ttft = ~np.isnan(ttft)
    has_tpot = ok & ~np.isnan(tpot)
    itl_keep = k > 0
    parts = [
        (M_TTFT, ttft[has_ttft], None, rec_all[has_ttft]),
        (M_ITL, itl[itl_keep], k[itl_keep], gap_rec[itl_keep]),
        (M_GAP, gaps, None, gap_rec),
        (M_TPOT, tpot[has_tpot], None, rec_all[has_tpot]),
        (M_E2E, e2e[ok], None, rec_all[ok]),
    ]
    clamped = 0
    base_parts: list[I64] = []
    w_parts: list[I64] = []
    r_parts: list[I64] = []
    fan_parts: list[npt.NDArray[np.bool_]] = []
    for metric, vals, w, rec in parts:
        if len(vals) == 0:
            continue
        nan = np.isnan(vals)
        if nan.any():
            clamped += int(nan.sum())
            vals, rec = vals[~nan], rec[~nan]
            w = None if w is None else w[~nan]
        us, bad = seconds_to_us(np.maximum(vals, 0.0))
        clamped += bad + int((vals < 0).sum())
        base_parts.append(bucket_index(us) + metric * SERIES_SPAN * COUNTS_LEN)
        w_parts.append(np.ones(len(vals), dtype=np.int64) if w is None else w)
        r_parts.append(rec)
        fan_parts.append(np.full(len(vals), metric != M_GAP))
    if base_parts:
        base = np.concatenate(base_parts)
        w_all = np.concatenate(w_parts)
        fan = np.concatenate(fan_parts)
        r_fan = np.concatenate(r_parts)[fan]
        b_fan, w_fan = base[fan], w_all[fan]
        us_series = np.asarray(user_series, dtype=np.int64)[r_fan]
        md_series = np.asarray(model_series, dtype=np.int64)[r_fan]
        keys = np.concatenate([base, b_fan + us_series * COUNTS_LEN,
                               b_fan + md_series * COUNTS_LEN])
        table = CountTable.from_keys(keys, np.concatenate([w_all, w_fan, w_fan]))
    else:
        table = CountTable.empty()

    counters = np.zeros(shape, dtype=np.int64)
    counters[0] += rows.sum(axis=0)
    np.add.at(counters, np.asarray(user_series, dtype=np.int64), rows)
    np.add.at(counters, np.asarray(model_series, dtype=np.int64), rows)
    good = np.where(met, out_tok, 0.0)
    return Batch(table, counters, met, conc, good, e2e, clamped)
