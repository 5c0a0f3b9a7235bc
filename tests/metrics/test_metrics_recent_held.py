"""The aggregator's recent requests (``/llmtop/v1/requests?state=recent``) held 500 records
with their chunk lists as Python tuples: ~40 bytes a chunk, 640 MB for 500 answers of 32k
tokens in a live proxy. They are now held packed and within a chunk budget; what the API
answers is unchanged."""

from __future__ import annotations

import sys

import pytest
from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.events import RequestRecord
from llmtop.metrics import aggregator as agg_mod
from llmtop.metrics.aggregator import RECENT_MAX, Aggregator
from llmtop.packed import HeldRecord


def _feed(agg: Aggregator, recs: list[RequestRecord]) -> None:
    agg.on_events(recs)


def test_recent_requests_are_the_same_dicts_held_packed() -> None:
    agg = Aggregator(Config(), clock=Clock())
    recs = [record(user=f"u{i % 7}", gaps=(0.01 + 0.001 * i,) * (300 + i),
                   tokens=(1,) + (1 + i % 3,) * (300 + i)) for i in range(30)]
    recs += [record(user="short", gaps=(0.02,) * 30)]  # short: held as it is
    _feed(agg, recs)
    got = agg.recent_requests(100)
    assert got == [r.to_json_dict() for r in recs]
    assert sum(isinstance(r, HeldRecord) for r in agg.recent) == 30
    # packed: a few bytes a chunk, where the tuples held ~40
    held = [r for r in agg.recent if isinstance(r, HeldRecord)]
    chunks = sum(len(r.offsets) // 8 for r in held)
    packed = sum(r.nbytes() + sys.getsizeof(r.offsets) for r in held)
    tuples = sum(sys.getsizeof(r.chunk_offsets_s) + 24 * len(r.chunk_offsets_s)
                 + sys.getsizeof(r.chunk_tokens) for r in recs[:30])
    assert packed / chunks < 20 and tuples / chunks > 35, (packed / chunks, tuples / chunks)


def test_recent_requests_stay_within_their_count_and_chunk_budgets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    agg = Aggregator(Config(), clock=Clock())
    for i in range(RECENT_MAX + 40):  # one at a time, as batches of one arrive
        _feed(agg, [record(rid=f"a{i}", gaps=(0.01,) * 9)])
    ids = [r["id"] for r in agg.recent_requests(RECENT_MAX)]
    assert ids == [f"a{i}" for i in range(40, RECENT_MAX + 40)]

    monkeypatch.setattr(agg_mod, "RECENT_MAX_CHUNKS", 1_000)
    big = [record(rid=f"b{i}", gaps=(0.01,) * 299) for i in range(5)]  # 300 chunks each
    _feed(agg, big)
    ids = [r["id"] for r in agg.recent_requests(RECENT_MAX)]
    assert ids == ["b2", "b3", "b4"]  # 900 chunks: the next older would pass 1,000
    assert agg._recent_chunks == 900
    huge = record(rid="c", gaps=(0.01,) * 1_999)  # beyond the budget alone: still kept
    _feed(agg, [huge])
    assert [r["id"] for r in agg.recent_requests(10)] == ["c"]
    assert agg.recent_requests(10)[0]["chunk_offsets_s"] == list(huge.chunk_offsets_s)
