"""Sparse count tables and interval windows: merges equal one histogram of the same values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.metrics.hdr import COUNTS_LEN, MEDIAN_EQ, Histogram, bucket_index, sparse_percentiles
from llmtop.metrics.table import SERIES_SPAN, CountTable, SplitTable, group_id, group_stats
from llmtop.metrics.windows import COARSE_S, FINE_S, WINDOWS, Windows

PS = (0.0, 50.0, 95.0, 99.0, 100.0)

samples = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 50_000_000)),
    max_size=200,
)


def table_of(rows: list[tuple[int, int, int]]) -> CountTable:
    if not rows:
        return CountTable.empty()
    a = np.array(rows, dtype=np.int64)
    keys = np.array([group_id(int(m), int(s)) for m, s, _ in rows]) * COUNTS_LEN
    return CountTable.from_keys(keys + bucket_index(a[:, 2]))


@settings(max_examples=80, deadline=None)
@given(samples, samples, samples)
def test_plus_and_minus_are_exact(a: list, b: list, c: list) -> None:
    ta, tb, tc = table_of(a), table_of(b), table_of(c)
    abc = table_of(a + b + c)
    s = ta.plus(tb).plus(tc)
    assert np.array_equal(s.keys, abc.keys) and np.array_equal(s.counts, abc.counts)
    m = CountTable.merge([tc, ta, tb])
    assert np.array_equal(m.keys, abc.keys) and np.array_equal(m.counts, abc.counts)
    back = s.plus(tb, sign=-1)
    ac = table_of(a + c)
    assert np.array_equal(back.keys, ac.keys) and np.array_equal(back.counts, ac.counts)
    assert (back.counts > 0).all()


@settings(max_examples=60, deadline=None)
@given(samples)
def test_group_stats_equal_per_histogram_percentiles(rows: list) -> None:
    t = table_of(rows)
    stats = group_stats(t, PS)
    groups = {(m, s) for m, s, _ in rows}
    assert len(stats.groups) == len(groups)
    for m, s in groups:
        h = Histogram()
        h.record_us([v for mm, ss, v in rows if (mm, ss) == (m, s)])
        i = stats.lookup(m, s)
        assert i is not None
        assert stats.values[i].tolist() == h.percentiles(PS)
        assert stats.totals[i] == h.total
        assert stats.maxes[i] == h.max()
        assert abs(stats.means[i] - h.mean()) <= 1e-9 * max(1.0, h.mean())
        idx, cnt = t.group_slice(m, s)
        assert sparse_percentiles(idx, cnt, PS) == h.percentiles(PS)


def test_remap_series_folds_and_keeps_totals() -> None:
    rows = [(0, 1, 100), (0, 2, 100), (0, 2, 5000), (1, 2, 7), (1, 3, 7)]
    t = table_of(rows).remap_series({2: 1})
    assert t.total == len(rows)
    _, cnt = t.group_slice(0, 1)
    assert cnt.sum() == 3
    assert len(t.group_slice(0, 2)[0]) == 0
    _, cnt = t.group_slice(1, 1)
    assert cnt.sum() == 1


events = st.lists(
    st.tuples(st.floats(0, 400, allow_nan=False), st.integers(0, 3), st.integers(0, 10**7)),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(events, st.floats(0, 9.99), st.floats(0, 60))
def test_window_views_equal_one_histogram_of_their_values(
    evs: list[tuple[float, int, int]], offset: float, tail: float
) -> None:
    """Values added over time: each window's merged table equals a single histogram of
    exactly the values whose time falls in the span the window reports."""
    t0 = 1_796_000_000.0 + offset
    w = Windows((5, 2), t0)
    evs = sorted(evs)
    for dt, series, v in evs:
        w.advance(t0 + dt)
        w.add(table_of([(0, series, v)]), _counter(series))
    now = t0 + (evs[-1][0] if evs else 0.0) + tail
    w.advance(now)
    for win in (*WINDOWS, None):
        view = w.view(win, now)
        inside = [(s, v) for dt, s, v in evs if t0 + dt >= view.start]
        want = table_of([(0, s, v) for s, v in inside])
        assert np.array_equal(view.table.keys, want.keys), win
        assert np.array_equal(view.table.counts, want.counts), win
        assert view.counters[:, 0].sum() == len(inside)
        if win is not None:
            assert win <= view.span_s <= win + (FINE_S if win == 10 else COARSE_S) or \
                view.start == t0
        else:
            assert view.start == t0


def _counter(series: int) -> np.ndarray:
    c = np.zeros((5, 2), dtype=np.int64)
    c[series, 0] = 1
    return c


def test_long_silence_keeps_all_and_empties_windows() -> None:
    t0 = 1_796_000_000.0
    w = Windows((2, 1), t0)
    w.add(table_of([(0, 0, 5)]), np.array([[1], [0]]))
    later = t0 + 10 * 24 * 3600  # ten days later: no per-interval loop over the gap
    w.advance(later)
    for win in WINDOWS:
        v = w.view(win, later)
        assert v.table.total == 0 and v.counters.sum() == 0
        assert win <= v.span_s <= win + COARSE_S
    assert w.view(None, later).table.total == 1
    w.add(table_of([(0, 0, 7)]), np.array([[1], [0]]))
    assert w.view(10, later).table.total == 1
    assert w.view(None, later).counters[0, 0] == 2


def test_remap_in_windows_moves_history() -> None:
    t0 = 1_796_000_000.0
    w = Windows((4, 1), t0)
    for i in range(40):
        w.advance(t0 + i * 3)
        c = np.zeros((4, 1), dtype=np.int64)
        c[2, 0] = 1
        w.add(table_of([(0, 2, 1000 + i)]), c)
    w.remap_series({2: 1})
    for win in (*WINDOWS, None):
        v = w.view(win, t0 + 120)
        assert v.counters[2, 0] == 0
        assert len(v.table.group_slice(0, 2)[0]) == 0
        assert v.table.total == v.counters[1, 0]
    # and later subtractions of old intervals stay exact
    w.advance(t0 + 1000)
    assert w.view(300, t0 + 1000).table.total == 0
    assert w.view(None, t0 + 1000).counters[1, 0] == 40


@settings(max_examples=120, deadline=None)
@given(samples, samples, st.lists(st.sampled_from(PS), min_size=1, max_size=4))
def test_split_table_queries_equal_the_merged_table(big: list, small: list, ps: list) -> None:
    """Percentiles, maxima, totals, bucket counts and sums of big + small, computed without
    merging, equal those of the merged table."""
    split = SplitTable(table_of(big), table_of(small))
    merged = table_of(big + small)
    groups = np.array(sorted({group_id(m, s) for m, s, _ in big + small} | {group_id(2, 3)}))
    totals, values, maxes = split.group_percentiles(groups, ps)
    stats = group_stats(merged, ps)
    for g, tot, row, mx in zip(groups, totals, values, maxes, strict=True):
        i = stats.lookup(int(g) // SERIES_SPAN, int(g) % SERIES_SPAN)
        if i is None:
            assert tot == 0 and mx == 0 and not row.any()
            continue
        assert tot == stats.totals[i]
        assert row.tolist() == stats.values[i].tolist()
        assert mx == stats.maxes[i]
    probe = np.concatenate([merged.keys, merged.keys - 1, merged.keys + 1, [0, 10**12]])
    want = np.searchsorted(merged.keys, probe, side="right")
    assert split.count_le(probe).tolist() == np.concatenate([[0], np.cumsum(merged.counts)])[
        want].tolist()
    sums = split.group_sums_us(groups)
    exact = split.group_sums_exact(groups)
    for g, sm, ex in zip(groups, sums, exact, strict=True):
        idx, cnt = merged.group_slice(int(g) // SERIES_SPAN, int(g) % SERIES_SPAN)
        assert sm == (cnt * MEDIAN_EQ[idx]).sum()
        assert ex == (cnt * MEDIAN_EQ[idx]).sum() and ex.dtype == np.int64
        bi, bc = split.group_hist(int(g) // SERIES_SPAN, int(g) % SERIES_SPAN)
        assert bi.tolist() == idx.tolist() and bc.tolist() == cnt.tolist()
    packed = split.extract(groups.tolist())
    for j, g in enumerate(groups.tolist()):
        idx, cnt = merged.group_slice(g // SERIES_SPAN, g % SERIES_SPAN)
        got_i, got_c = packed.group_slice(0, j)
        assert got_i.tolist() == idx.tolist() and got_c.tolist() == cnt.tolist()


def test_split_table_percentiles_with_heavy_counts_equal_the_merged_table() -> None:
    """Grouped percentiles of big + small where either table holds large counts in few keys
    (the searches' bounds then span many keys of the other: the bounded search, its
    narrowing steps and the all-at-once evaluation of what is left) equal the merged
    table's, as do the exact sums."""
    rng = np.random.default_rng(7)
    ps = [0.0, 1.0, 10.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]

    def table(groups: np.ndarray, n_max: int, w_max: int) -> CountTable:
        n = int(rng.integers(0, n_max))
        g = rng.choice(groups, n)
        idx = rng.integers(0, int(rng.integers(1, 3000)), n)
        return CountTable.from_keys(g * COUNTS_LEN + idx,
                                    rng.integers(1, w_max + 1, n).astype(np.int64))

    for _ in range(400):
        groups = np.arange(int(rng.integers(1, 4))) * SERIES_SPAN + int(rng.integers(0, 3))
        big = table(groups, int(rng.choice([5, 400])), int(rng.choice([1, 50])))
        small = table(groups, int(rng.choice([5, 50, 400])), int(rng.choice([1, 5, 500])))
        split = SplitTable(big, small)
        merged = CountTable.merge([big, small])
        asked = [float(p) for p in rng.choice(ps, int(rng.integers(1, 6)))]
        totals, values, maxes = split.group_percentiles(groups, asked)
        sums = split.group_sums_exact(groups)
        stats = group_stats(merged, asked)
        for g, tot, row, mx, sm in zip(groups, totals, values, maxes, sums, strict=True):
            i = stats.lookup(int(g) // SERIES_SPAN, int(g) % SERIES_SPAN)
            if i is None:
                assert tot == 0 and mx == 0 and sm == 0
                continue
            assert (tot, mx) == (stats.totals[i], stats.maxes[i])
            assert row.tolist() == stats.values[i].tolist()
            assert sm / tot == stats.means[i]
