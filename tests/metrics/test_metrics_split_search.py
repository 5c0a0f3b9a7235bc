"""Grouped percentiles of a split table take the small table's keys in blocks once it is
large (:meth:`SplitTable._first_small`): every block size, down to a key per block, and
the direct search give the merged table's answers; so do the summaries' exact sums."""

from __future__ import annotations

import numpy as np
import pytest

import llmtop.metrics.table as table_mod
from llmtop.metrics.hdr import COUNTS_LEN
from llmtop.metrics.table import SERIES_SPAN, CountTable, SplitTable, group_stats


def _table(rng: np.random.Generator, groups: np.ndarray, n: int, w_max: int) -> CountTable:
    g = rng.choice(groups, n)
    idx = rng.integers(0, int(rng.integers(1, 5000)), n)
    return CountTable.from_keys(g * COUNTS_LEN + idx,
                                rng.integers(1, w_max + 1, n).astype(np.int64))


@pytest.mark.parametrize("block_min", [1, 2, 10**9])
def test_block_search_equals_the_merged_table(monkeypatch: pytest.MonkeyPatch,
                                              block_min: int) -> None:
    monkeypatch.setattr(table_mod, "_BLOCK_MIN", block_min)
    rng = np.random.default_rng(11)
    ps = [0.0, 1.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]
    for _ in range(150):
        groups = np.unique(rng.integers(0, 3, 4) * SERIES_SPAN + rng.integers(0, 4, 4))
        big = _table(rng, groups, int(rng.choice([0, 3, 300, 3000])),
                     int(rng.choice([1, 40])))
        small = _table(rng, groups, int(rng.choice([0, 2, 200, 2000])),
                       int(rng.choice([1, 3, 400])))
        asked = sorted({float(p) for p in rng.choice(ps, int(rng.integers(1, 5)))})
        query = np.append(groups, SERIES_SPAN * 2 + 9)  # and a group with no data
        split = SplitTable(big, small)
        summary = split.group_summary(query.tolist(), asked)
        assert summary.sums.tolist() == split.group_sums_exact(query).tolist()
        stats = group_stats(CountTable.merge([big, small]), asked)
        for g, tot, row, mx, sm in zip(query, summary.totals, summary.values, summary.maxes,
                                       summary.sums, strict=True):
            i = stats.lookup(int(g) // SERIES_SPAN, int(g) % SERIES_SPAN)
            if i is None:
                assert tot == 0 and mx == 0 and sm == 0 and not row.any()
                continue
            assert (tot, mx) == (stats.totals[i], stats.maxes[i])
            assert row.tolist() == stats.values[i].tolist()
            assert sm / tot == stats.means[i]


def test_no_groups_asked() -> None:
    """No groups: empty answers of the right shapes (nothing to search)."""
    rng = np.random.default_rng(3)
    groups = np.array([0, 1]) * SERIES_SPAN
    split = SplitTable(_table(rng, groups, 30, 3), _table(rng, groups, 10, 3))
    summary = split.group_summary(np.empty(0, dtype=np.int64), [50.0, 99.0])
    assert summary.values.shape == (0, 2)
    assert len(summary.totals) == len(summary.maxes) == len(summary.sums) == 0
