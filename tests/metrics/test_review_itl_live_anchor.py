"""A long stream's ITL is filed live from its slices with the live weights (the parser's
counts, or times the model's learned tokens per event), then its record files the rest with
its own counts (scaled to the engine's usage). Where the two disagree on whether the last
chunk filed live carried tokens, the record's first ITL gap must still run from the chunk
the live samples ended at: else the time between them is counted twice (the live weight
said tokens, the record's 0) or never (the live weight 0, the record's tokens)."""

from __future__ import annotations

import numpy as np
from metrics_records import Clock

from llmtop.config import Config
from llmtop.events import ChunkSlice, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.hdr import bucket_index, seconds_to_us
from llmtop.metrics.ingest import M_ITL

NS = 1_000_000_000
T0_NS = 7 * NS
GAP_NS = 40_000_000
N = 1_100
LIVE = 1_024  # chunks filed live (two slices); the record files the rest


def _times(long_gap_at: int | None) -> list[int]:
    ns, t = [], T0_NS + NS // 2
    for i in range(N):
        if i:
            t += 12 * GAP_NS if i == long_gap_at else GAP_NS
        ns.append(t)
    return ns


def _slices(ns: list[int], toks: list[int]) -> list[ChunkSlice]:
    t_start = 1_700_000_000.0
    return [ChunkSlice("s", "alice", "m", t_start + (ns[hi - 1] - T0_NS) / NS, T0_NS, lo,
                       ns[lo - 1] if lo else None, tuple(ns[lo:hi]), tuple(toks[lo:hi]))
            for lo, hi in ((0, 512), (512, LIVE))]


def _record(ns: list[int], toks: list[int]) -> RequestRecord:
    offs = tuple((t - T0_NS) / NS for t in ns)
    return RequestRecord(
        id="s", user="alice", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=1_700_000_000.0, ttft_s=offs[0],
        e2e_s=offs[-1] + 0.001, prompt_tokens=10, completion_tokens=sum(toks),
        token_source="usage", chunk_offsets_s=offs, chunk_tokens=tuple(toks))


def _hist(live_toks: list[int], rec_toks: list[int], ns: list[int]) -> dict[int, int]:
    """The ITL histogram the rule gives: the live weights up to chunk LIVE - 1, the
    record's counts after it, one anchor running across both."""
    vals: list[float] = []
    weights: list[int] = []
    offs = [(t - T0_NS) / NS for t in ns]
    a = 0
    for i in range(1, N):
        k = live_toks[i] if i < LIVE else rec_toks[i]
        if k > 0:
            vals.append((offs[i] - offs[a]) / k)
            weights.append(k)
            a = i
    us, _ = seconds_to_us(np.array(vals))
    out: dict[int, int] = {}
    for b, w in zip(bucket_index(us).tolist(), weights, strict=True):
        out[b] = out.get(b, 0) + w
    return out


def _filed(live_toks: list[int], rec_toks: list[int], ns: list[int]) -> dict[int, int]:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    agg.on_events(_slices(ns, live_toks))
    rec = _record(ns, rec_toks)
    clock.t = rec.t_start + rec.e2e_s
    agg.on_events([rec])
    idx, counts = agg.view(None).table.group_slice(M_ITL, 0)
    return dict(zip(idx.tolist(), counts.tolist(), strict=True))


def test_a_last_live_chunk_with_tokens_the_record_says_0_is_not_counted_twice() -> None:
    ns = _times(None)  # 40 ms between every two chunks
    live_toks = [1] * N
    rec_toks = [1] * N
    rec_toks[LIVE - 1] = 0  # counts scaled down to the usage: this chunk carried 0
    got = _filed(live_toks, rec_toks, ns)
    assert got == _hist(live_toks, rec_toks, ns)
    # every gap is 40 ms: no 80 ms sample (chunk LIVE's gap run from chunk LIVE - 2)
    us, _ = seconds_to_us(np.array([2 * GAP_NS / NS]))
    assert int(bucket_index(us)[0]) not in got, got


def test_a_last_live_chunk_of_weight_0_the_record_counts_swallows_no_time() -> None:
    ns = _times(LIVE - 1)  # 480 ms before the last chunk filed live
    live_toks = [1] * N
    live_toks[LIVE - 1] = 0  # its live weight (e.g. a learned rate below 1, rounded)
    rec_toks = [1] * N
    got = _filed(live_toks, rec_toks, ns)
    assert got == _hist(live_toks, rec_toks, ns)
    # the 480 ms are in chunk LIVE's sample (520 ms), not lost
    us, _ = seconds_to_us(np.array([13 * GAP_NS / NS]))
    assert int(bucket_index(us)[0]) in got, got
