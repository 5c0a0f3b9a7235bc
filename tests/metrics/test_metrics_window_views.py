"""A window's view reuses the sum of its closed intervals between views: what it gives —
histograms, counters, concurrency — equals a sum taken afresh at every point — between
adds, samples and corrections of the all-time counters, as intervals close, after series
are folded and after a long silence."""

from __future__ import annotations

import random

import numpy as np

from llmtop.metrics.hdr import COUNTS_LEN, bucket_index
from llmtop.metrics.table import CountTable, group_id
from llmtop.metrics.windows import WINDOWS, Windows, WindowView

T0 = 1_796_000_001.0


def _table(rng: random.Random) -> CountTable:
    n = rng.randrange(1, 30)
    keys = np.array([group_id(rng.randrange(3), rng.randrange(2, 6)) for _ in range(n)])
    us = np.array([rng.randrange(0, 5_000_000) for _ in range(n)], dtype=np.int64)
    return CountTable.from_keys(keys * COUNTS_LEN + bucket_index(us))


def _fresh(w: Windows, window: int | None, now: float) -> WindowView:
    saved = dict(w._closed_sums)
    w._closed_sums.clear()
    try:
        return w.view(window, now)
    finally:
        w._closed_sums.update(saved)


def test_views_between_closes_equal_fresh_sums() -> None:
    rng = random.Random(5)
    shape = (8, 3)
    w = Windows(shape, T0)
    now = T0
    views = added = 0
    for step in range(400):
        now += rng.choice([0.1, 0.3, 0.7, 1.9])
        if step == 200:
            now += 900.0  # a long silence: the rings restart
        w.advance(now)
        t = _table(rng)
        added += t.total
        w.add(t, np.ones(shape, dtype=np.int64))
        w.sample((rng.randrange(9), rng.randrange(9), rng.random() * 5))
        if rng.random() < 0.3:
            w.add_to_total(1, np.arange(shape[0], dtype=np.int64) - 3)
        if step % 50 == 49:
            w.remap_series({rng.randrange(2, 6): 1})
        for window in (*WINDOWS, None):
            if rng.random() < 0.5:
                view = w.view(window, now)
                fresh = _fresh(w, window, now)
                got, want = view.split.merged(), fresh.split.merged()
                assert np.array_equal(got.keys, want.keys), (step, window)
                assert np.array_equal(got.counts, want.counts), (step, window)
                assert np.array_equal(view.counters, fresh.counters), (step, window)
                assert view.conc_sum.tolist() == fresh.conc_sum.tolist(), (step, window)
                assert view.conc_max.tolist() == fresh.conc_max.tolist(), (step, window)
                view.counters += 1  # the caller's to change: the next view is unmoved
                views += 1
    assert views > 700
    assert w.view(None, now).split.merged().total == added  # "all" kept every count
