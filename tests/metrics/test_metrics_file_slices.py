"""Filing is bounded by chunk count: a queue of many long answers is filed in slices.

QA: 256 answers of 16k tokens finishing together were filed as one batch and ``report``
peaked at 1.9 GB (190 MB when spread). ``flush`` now files at most about
``FILE_SLICE_CHUNKS`` chunks at a time; what is filed is the same."""

from __future__ import annotations

import tracemalloc

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.metrics.aggregator import FILE_SLICE_CHUNKS, Aggregator

CHUNKS = 16_000
N = 48  # 768k chunks: about four slices


def test_many_long_answers_at_once_are_filed_in_bounded_slices() -> None:
    clock = Clock()
    records = [record(rid=f"r{i}", user=f"u{i % 3}", ttft=0.5, gaps=[0.01] * (CHUNKS - 1),
                      tokens=[1 + (j % 2) for j in range(CHUNKS)], t_start=clock.t - 200)
               for i in range(N)]
    agg = Aggregator(Config(), clock=clock)
    tracemalloc.start()
    try:
        agg.on_events(records)
        agg.flush()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert agg.pending_records == 0 and agg.filing_errors == 0
    # filing peaks at ~400 bytes a chunk filed at once: one slice (~83 MB), not the whole
    # queue (~310 MB as one batch)
    assert peak < 500 * FILE_SLICE_CHUNKS, peak
    snap = agg.snapshot(None)
    assert snap["system"]["requests"] == N
    assert snap["system"]["output_tokens"] == N * sum(1 + (j % 2) for j in range(CHUNKS))
    assert snap["latency"]["ttft"]["count"] == N
    assert snap["latency"]["itl"]["count"] == N * (sum(1 + (j % 2) for j in range(CHUNKS)) - 1)
