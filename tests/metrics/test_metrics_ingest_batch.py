"""The batch filing against per-record rules: the histogram table of a batch equals one
built sample by sample, the counted ITL check equals the sorted P95, and counting keys
equals summing their weights."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.events import RequestRecord
from llmtop.metrics.hdr import COUNTS_LEN, HIGHEST, bucket_index
from llmtop.metrics.ingest import COUNTERS, M_E2E, M_GAP, M_ITL, M_TPOT, M_TTFT, ingest
from llmtop.metrics.slo import FLOAT_SLACK_S, Slo, grouped_itl_p95, grouped_itl_within
from llmtop.metrics.table import SERIES_SPAN, CountTable

ODD = st.sampled_from([float("nan"), -0.01, 5000.0])
SECONDS = st.floats(0.0, 0.2) | ODD


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    gaps = draw(st.lists(SECONDS, max_size=12))
    ttft = draw(st.none() | SECONDS)
    offs: list[float] = []
    if ttft is not None:
        offs = [ttft]
        for g in gaps:
            offs.append(offs[-1] + g)
    toks = draw(st.lists(st.sampled_from([1, 1, 1, 2, 3, 0, -1]),
                         min_size=max(len(offs) - 2, 0), max_size=len(offs) + 1))
    return RequestRecord(
        id="r", user="u", model="m", dialect="openai", path="/", stream=True, status=200,
        outcome=draw(st.sampled_from(["ok", "ok", "error", "cancelled"])),
        t_start=0.0, ttft_s=ttft, e2e_s=draw(SECONDS),
        prompt_tokens=draw(st.none() | st.integers(0, 100)),
        completion_tokens=draw(st.none() | st.integers(0, 20)), token_source="usage",
        chunk_offsets_s=tuple(offs), chunk_tokens=tuple(toks),
        concurrency_at_start=draw(st.integers(0, 8)),
    )


def _reference(recs: list[RequestRecord], users: list[int], models: list[int]
               ) -> tuple[Counter[int], int]:
    """Sample by sample: what each record puts in the table, and the values clamped."""
    counts: Counter[int] = Counter()
    clamped = 0

    def put(metric: int, value: float, weight: int, i: int, fan: bool) -> None:
        nonlocal clamped
        if math.isnan(value):
            clamped += 1
            return
        us = round(max(value, 0.0) * 1e6)
        clamped += value < 0 or us > HIGHEST
        idx = int(bucket_index(np.array([min(us, HIGHEST)]))[0])
        for series in (0, users[i], models[i]) if fan else (0,):
            counts[(metric * SERIES_SPAN + series) * COUNTS_LEN + idx] += weight

    for i, r in enumerate(recs):
        if r.ttft_s is not None and not math.isnan(r.ttft_s):  # NaN: no first token
            put(M_TTFT, r.ttft_s, 1, i, True)
        offs = r.chunk_offsets_s
        anchor = 0  # the last chunk that carried tokens, or chunk 0
        for j in range(1, len(offs)):
            k = r.chunk_tokens[j] if j < len(r.chunk_tokens) else 1
            put(M_GAP, offs[j] - offs[j - 1], 1, i, False)
            if k > 0:
                put(M_ITL, (offs[j] - offs[anchor]) / k, k, i, True)
                anchor = j
        tpot = r.tpot_s()
        if r.outcome == "ok":
            if tpot is not None and not math.isnan(tpot):
                put(M_TPOT, tpot, 1, i, True)
            put(M_E2E, r.e2e_s, 1, i, True)
    return +counts, clamped


@settings(max_examples=150, deadline=None)
@given(st.lists(records(), min_size=1, max_size=12))
def test_a_batch_table_equals_the_samples_one_by_one(recs: list[RequestRecord]) -> None:
    users = [2 + i % 3 for i in range(len(recs))]
    models = [9 + i % 2 for i in range(len(recs))]
    b = ingest(recs, users, models, [0] * len(recs), Slo(), (12, len(COUNTERS)))
    want, clamped = _reference(recs, users, models)
    assert dict(zip(b.table.keys.tolist(), b.table.counts.tolist(), strict=True)) == want
    assert b.clamped == clamped


def test_a_zero_token_chunk_gives_no_itl_sample_and_swallows_no_time() -> None:
    """Records with 0-token chunks after the first, in the middle, several in a row and
    at the end, batched with a one-token record: the ITL histogram holds each record's
    token-carrying chunks' gaps from the previous token-carrying chunk (or chunk 0), and
    the chunk gaps are unchanged. Every token here is 0.1 s after the one before it, so
    every ITL sample is 0.1 s (not the 0.01 s from a 0-token chunk just before it)."""
    spread = _rec((0.0, 0.09, 0.1, 0.19, 0.2, 0.3, 0.35, 0.39, 0.4, 0.5, 0.55),
                  (1, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0))
    plain = _rec((0.0, 0.1, 0.2), (1, 1, 1))
    b = ingest([spread, plain], [2, 3], [9, 9], [0, 0], Slo(itl_p95_s=0.05),
               (12, len(COUNTERS)))
    want, _ = _reference([spread, plain], [2, 3], [9, 9])
    assert dict(zip(b.table.keys.tolist(), b.table.counts.tolist(), strict=True)) == want
    itl = b.table.group_slice(M_ITL, 0)
    assert itl[1].sum() == 5 + 2
    assert itl[0].tolist() == bucket_index(np.array([100_000])).tolist()  # all 0.1 s
    assert b.table.group_slice(M_GAP, 0)[1].sum() == 10 + 2
    assert b.met.tolist() == [False, False]  # 0.1 s, both: over the 50 ms limit


def _rec(offs: tuple[float, ...], toks: tuple[int, ...]) -> RequestRecord:
    return RequestRecord(
        id="z", user="u", model="m", dialect="openai", path="/", stream=True, status=200,
        outcome="ok", t_start=0.0, ttft_s=offs[0], e2e_s=offs[-1] + 0.01, prompt_tokens=3,
        completion_tokens=sum(toks), token_source="usage", chunk_offsets_s=offs,
        chunk_tokens=toks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 0.2) | st.just(float("nan")),
                          st.integers(-1, 4)), max_size=60),
       st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.2]))
def test_counted_itl_check_equals_the_sorted_p95(rows: list[tuple[int, float, int]],
                                                 limit: float) -> None:
    rows.sort(key=lambda r: r[0])
    rec = np.array([r[0] for r in rows], dtype=np.int64)
    itl = np.array([r[1] for r in rows], dtype=np.float64)
    w = np.array([r[2] for r in rows], dtype=np.int64)
    p95 = grouped_itl_p95(rec, itl, w, 6)
    want = np.isnan(p95) | (p95 <= limit + FLOAT_SLACK_S)  # within a ns meets it
    assert grouped_itl_within(rec, itl, w, 6, limit).tolist() == want.tolist()


@given(st.lists(st.integers(0, 50), max_size=200), st.booleans())
def test_counting_keys_equals_summing_weights(keys: list[int], weighted: bool) -> None:
    k = np.array(keys, dtype=np.int64)
    w = (np.arange(len(keys), dtype=np.int64) % 3) - 1 if weighted else None
    t = CountTable.from_keys(k, w)
    want: Counter[int] = Counter()
    for i, key in enumerate(keys):
        want[key] += 1 if w is None else int(w[i])
    assert dict(zip(t.keys.tolist(), t.counts.tolist(), strict=True)) == \
        {a: c for a, c in want.items() if c}
    assert t.keys.tolist() == sorted(t.keys.tolist())
    ones = CountTable.from_keys(k, np.ones(len(keys), dtype=np.int64))
    plain = CountTable.from_keys(k)
    assert np.array_equal(ones.keys, plain.keys) and np.array_equal(ones.counts, plain.counts)
