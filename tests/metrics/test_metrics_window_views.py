"""A window's view reuses the sum of its closed intervals between views: what it gives
equals a sum taken afresh at every point — between adds, as intervals close, after series
are folded and after a long silence."""

from __future__ import annotations

import random

import numpy as np

from llmtop.metrics.hdr import COUNTS_LEN, bucket_index
from llmtop.metrics.table import CountTable, group_id
from llmtop.metrics.windows import WINDOWS, Windows

T0 = 1_796_000_001.0


def _table(rng: random.Random) -> CountTable:
    n = rng.randrange(1, 30)
    keys = np.array([group_id(rng.randrange(3), rng.randrange(2, 6)) for _ in range(n)])
    us = np.array([rng.randrange(0, 5_000_000) for _ in range(n)], dtype=np.int64)
    return CountTable.from_keys(keys * COUNTS_LEN + bucket_index(us))


def _fresh(w: Windows, window: int | None, now: float) -> CountTable:
    saved = dict(w._closed_sums)
    w._closed_sums.clear()
    try:
        return w.view(window, now).split.merged()
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
        if step % 50 == 49:
            w.remap_series({rng.randrange(2, 6): 1})
        for window in (*WINDOWS, None):
            if rng.random() < 0.5:
                got = w.view(window, now).split.merged()
                want = _fresh(w, window, now)
                assert np.array_equal(got.keys, want.keys), (step, window)
                assert np.array_equal(got.counts, want.counts), (step, window)
                views += 1
    assert views > 700
    assert w.view(None, now).split.merged().total == added  # "all" kept every count
