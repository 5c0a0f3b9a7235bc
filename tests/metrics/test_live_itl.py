"""ITL and chunk-gap samples are filed while a stream is open, from the relay's chunk slices.

QA: with 10-minute reasoning answers, the 60 s window's ITL p50 showed only the short
answers' 5 ms for 9m47s, then 39.8 ms from 58,797 samples mostly older than the window
(every sample came with its record, at the end). Now a slice's samples land in the interval
it arrives in; the record files only the chunks no slice filed, so after it the session's
histograms are exactly those of filing the record alone at its end."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest
from metrics_records import Clock
from observed_support import observed_proxy

from llmtop.config import Config, SloConfig
from llmtop.events import ActiveRequest, ChunkSlice, Outcome, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.hdr import bucket_index, seconds_to_us
from llmtop.metrics.ingest import M_GAP, M_ITL
from llmtop.metrics.table import CountTable
from llmtop.sim.server import running_sim

NS = 1_000_000_000
T0_NS = 7 * NS


class Stream:
    """One long stream as the relay sees it: perf_counter_ns chunk times and raw counts."""

    def __init__(
        self,
        rid: str,
        t_start: float,
        n: int,
        gap_ns: int,
        *,
        tokens: list[int] | None = None,
        user: str = "alice",
        model: str = "m",
    ) -> None:
        self.rid, self.t_start, self.user, self.model = rid, t_start, user, model
        rng = np.random.default_rng(7)
        jitter = rng.integers(-gap_ns // 3, gap_ns // 3, n)
        first = T0_NS + NS // 2
        self.ns = [first + i * gap_ns + int(j) for i, j in enumerate(jitter)]
        self.ns[0] = first
        self.tokens = tokens if tokens is not None else [1 + i % 3 for i in range(n)]

    def unix(self, i: int) -> float:
        """The unix time of chunk i."""
        return self.t_start + (self.ns[i] - T0_NS) / 1e9

    def slice(self, lo: int, hi: int) -> ChunkSlice:
        return ChunkSlice(
            self.rid,
            self.user,
            self.model,
            self.unix(hi - 1),
            T0_NS,
            lo,
            self.ns[lo - 1] if lo else None,
            tuple(self.ns[lo:hi]),
            tuple(self.tokens[lo:hi]),
        )

    def record(
        self, outcome: Outcome = "ok", chunk_tokens: tuple[int, ...] | None = None
    ) -> RequestRecord:
        offs = tuple((o - T0_NS) / 1e9 for o in self.ns)
        toks = tuple(self.tokens) if chunk_tokens is None else chunk_tokens
        return RequestRecord(
            id=self.rid,
            user=self.user,
            model=self.model,
            dialect="openai",
            path="/v1/chat/completions",
            stream=True,
            status=200,
            outcome=outcome,
            t_start=self.t_start,
            ttft_s=offs[0],
            e2e_s=offs[-1] + 0.001,
            prompt_tokens=10,
            completion_tokens=sum(toks),
            token_source="usage",
            chunk_offsets_s=offs,
            chunk_tokens=toks,
        )


def totals(table: CountTable, metric: int, series: int = 0) -> int:
    return int(table.group_slice(metric, series)[1].sum())


def itl_weight(rec: RequestRecord, lo: int = 1, hi: int | None = None) -> int:
    """The ITL weight of the gaps that end at chunks lo..hi-1 of ``rec``."""
    return sum(k for k in rec.chunk_tokens[lo:hi] if k > 0)


@pytest.mark.parametrize("outcome", ["ok", "cancelled", "error"])
def test_slices_land_while_the_stream_is_open_and_the_record_files_the_rest(
    outcome: Outcome,
) -> None:
    cfg = Config(slo=SloConfig(itl_p95_s=0.5))
    live_clock, end_clock = Clock(), Clock()
    reg: dict[str, ActiveRequest] = {}
    live = Aggregator(cfg, reg, clock=live_clock)
    at_end = Aggregator(cfg, clock=end_clock)
    s = Stream("long", live_clock.t, 1_300, 400_000_000)  # 0.4 s a chunk: ~520 s
    reg["long"] = ActiveRequest(
        "long", "alice", "m", "openai", "/v1/chat/completions", True, s.t_start, T0_NS
    )
    rec = s.record(outcome)
    cuts = [(0, 512), (512, 1_024)]
    for lo, hi in cuts:
        live_clock.t = end_clock.t = s.unix(hi - 1) + 0.05
        live.on_events([s.slice(lo, hi)])
        at_end.tick()
        live.tick()
        win = live.view(60).table
        # the slice's samples are in the 60 s window now, and only those of the last minute
        # … of slices: the slice's own gaps, every one of them
        assert totals(win, M_GAP) == hi - lo - (lo == 0)
        assert totals(win, M_ITL) == itl_weight(rec, max(lo, 1), hi)
        assert totals(at_end.view(None).table, M_ITL) == 0  # nothing until the record
    snap = live.snapshot(60)
    assert snap["latency"]["itl"]["count"] == itl_weight(rec, 512, 1_024)
    assert 0.08 <= snap["latency"]["itl"]["p50"] <= 0.45
    user = next(u for u in snap["users"] if u["user"] == "alice")
    assert user["itl_p50"] is not None
    live_clock.t = end_clock.t = rec.t_start + rec.e2e_s + 0.01
    del reg["long"]
    live.on_events([rec])
    at_end.on_events([rec])
    a, b = live.view(None), at_end.view(None)
    # every sample exactly once: the session's histograms are the same, bucket for bucket
    assert np.array_equal(a.table.keys, b.table.keys)
    assert np.array_equal(a.table.counts, b.table.counts)
    assert np.array_equal(a.counters, b.counters)
    assert totals(a.table, M_ITL) == itl_weight(rec)
    assert totals(a.table, M_GAP) == len(rec.chunk_offsets_s) - 1
    # the last minute holds the record's own remainder: from the gap after chunk 1,023 on
    recent = live.view(60).table
    assert totals(recent, M_ITL) == itl_weight(rec, 1_024)
    assert totals(recent, M_GAP) == 1_300 - 1_024
    sa, sb = live.snapshot(None), at_end.snapshot(None)
    assert sa["system"]["slo_met"] == sb["system"]["slo_met"]
    assert sa["latency"] == sb["latency"]


def _itl_hist(rec: RequestRecord, below: int | None = None) -> dict[int, int]:
    """The ITL histogram (hdr index → count) by the rule, from the record's chunks: a chunk
    with k > 0 tokens gives k samples of g/k, g from the previous chunk that carried tokens
    (or chunk 0); only the chunks before ``below``, when given."""
    offs, toks = rec.chunk_offsets_s, rec.chunk_tokens
    vals: list[float] = []
    weights: list[int] = []
    a = 0
    for i in range(1, len(offs) if below is None else below):
        if toks[i] > 0:
            vals.append((offs[i] - offs[a]) / toks[i])
            weights.append(toks[i])
            a = i
    us, _ = seconds_to_us(np.array(vals))
    out: dict[int, int] = {}
    for b, w in zip(bucket_index(us).tolist(), weights, strict=True):
        out[b] = out.get(b, 0) + w
    return out


def _table_hist(table: CountTable, metric: int) -> dict[int, int]:
    idx, counts = table.group_slice(metric, 0)
    return dict(zip(idx.tolist(), counts.tolist(), strict=True))


def test_zero_token_chunks_across_slices_swallow_no_time_live_or_at_the_end() -> None:
    """0-token chunks (counts scaled down to the usage): the first chunk, the one after it,
    one in the middle of a slice, the last of a slice, the first of the next, several in a
    row across the record's boundary and the last. A token-carrying chunk's ITL gap runs
    from the previous token-carrying chunk, across slices and into the record's share: the
    live histograms equal the rule's over the chunks filed, and after the record, the
    finished record's alone, bucket for bucket."""
    clock, end_clock = Clock(), Clock()
    live, at_end = Aggregator(Config(), clock=clock), Aggregator(Config(), clock=end_clock)
    n = 1_300
    tokens = [1 + i % 3 for i in range(n)]
    for i in (0, 1, 300, 511, 512, 1_022, 1_023, 1_024, 1_025, n - 1):
        tokens[i] = 0
    s = Stream("zeros", clock.t, n, 40_000_000, tokens=tokens)
    rec = s.record()
    live.on_events([s.slice(0, 512)])
    assert _table_hist(live.view(None).table, M_ITL) == _itl_hist(rec, 512)
    live.on_events([s.slice(512, 1_024)])
    assert _table_hist(live.view(None).table, M_ITL) == _itl_hist(rec, 1_024)
    assert totals(live.view(None).table, M_GAP) == 1_023
    clock.t = end_clock.t = rec.t_start + rec.e2e_s
    live.on_events([rec])
    at_end.on_events([rec])
    a, b = live.view(None).table, at_end.view(None).table
    assert _table_hist(a, M_ITL) == _itl_hist(rec)
    assert np.array_equal(a.keys, b.keys)
    assert np.array_equal(a.counts, b.counts)
    assert totals(a, M_GAP) == n - 1
    # the samples add up to the time from chunk 0 to the last token-carrying chunk
    assert sum(rec.itl_samples_s()) == pytest.approx(rec.chunk_offsets_s[n - 2]
                                                     - rec.chunk_offsets_s[0], rel=1e-9)


def test_streams_sliced_together_each_keep_their_own_anchor() -> None:
    """Three streams' slices filed in one batch each round, 0-token chunks at random (one
    with none): every stream's ITL runs from its own last token-carrying chunk, so after
    their records the histograms are those of filing the records alone."""
    clock, end_clock = Clock(), Clock()
    live, at_end = Aggregator(Config(), clock=clock), Aggregator(Config(), clock=end_clock)
    rng = np.random.default_rng(3)
    streams = []
    for j, p_zero in enumerate((0.3, 0.0, 0.6)):
        toks = [0 if rng.random() < p_zero else int(rng.integers(1, 4)) for _ in range(1_100)]
        streams.append(Stream(f"s{j}", clock.t, 1_100, 20_000_000 + j * 7_000_000,
                              tokens=toks, user=f"u{j}"))
    live.on_events([s.slice(0, 512) for s in streams])
    live.on_events([s.slice(512, 1_024) for s in streams])
    recs = [s.record() for s in streams]
    clock.t = end_clock.t = max(r.t_start + r.e2e_s for r in recs)
    live.on_events(recs)
    at_end.on_events(recs)
    a, b = live.view(None).table, at_end.view(None).table
    assert np.array_equal(a.keys, b.keys)
    assert np.array_equal(a.counts, b.counts)
    want: dict[int, int] = {}
    for r in recs:
        for k, v in _itl_hist(r).items():
            want[k] = want.get(k, 0) + v
    assert _table_hist(a, M_ITL) == want


def test_a_missing_slice_leaves_the_rest_to_the_record() -> None:
    """A slice lost on the way (a worker's full buffer): the stream's later slices are not
    filed either, and its record files every chunk from the first one not filed."""
    clock, end_clock = Clock(), Clock()
    live, at_end = Aggregator(Config(), clock=clock), Aggregator(Config(), clock=end_clock)
    s = Stream("gappy", clock.t, 1_600, 100_000_000)
    live.on_events([s.slice(0, 512)])
    live.on_events([s.slice(1_024, 1_536)])  # 512..1,023 never came
    assert totals(live.view(None).table, M_GAP) == 511
    rec = s.record()
    clock.t = end_clock.t = rec.t_start + rec.e2e_s
    live.on_events([rec])
    at_end.on_events([rec])
    assert np.array_equal(live.view(None).table.counts, at_end.view(None).table.counts)


def test_a_record_with_no_slices_files_all_its_samples() -> None:
    """A replay feeds records only; so does a stream shorter than one slice."""
    agg = Aggregator(Config(), clock=Clock())
    s = Stream("replayed", Clock().t, 900, 10_000_000)
    rec = s.record()
    agg.on_events([rec])
    t = agg.view(None).table
    assert totals(t, M_GAP) == 899
    assert totals(t, M_ITL) == itl_weight(rec)


def test_live_weights_take_the_models_learned_tokens_per_event() -> None:
    """An engine that packs 3 tokens into each event the parser counts as one: once the
    model's rate is learned, live ITL samples are gap/3 with weight 3 — not the gap, 3×
    too long — and the stream's weights add up to its usage within a token."""
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    agg.tokens_per_event["m"] = 3.0
    s = Stream("packed", clock.t, 1_100, 30_000_000, tokens=[1] * 1_100)
    agg.on_events([s.slice(0, 512), s.slice(512, 1_024)])
    snap = agg.snapshot(None)
    assert snap["latency"]["itl"]["count"] == 3 * 1_023
    assert snap["latency"]["itl"]["p50"] == pytest.approx(0.010, rel=0.2)
    assert snap["latency"]["chunk_gap"]["count"] == 1_023
    usage = 1 + 3 * 1_099
    scaled = (1,) + (3,) * 1_099  # what the relay's record says (scaled to the usage)
    rec = s.record(chunk_tokens=scaled)
    assert rec.completion_tokens == usage
    clock.t = rec.t_start + rec.e2e_s
    agg.on_events([rec])
    snap = agg.snapshot(None)
    assert abs(snap["latency"]["itl"]["count"] - (usage - 1)) <= 1
    assert snap["latency"]["chunk_gap"]["count"] == 1_099


def test_a_stream_whose_record_never_comes_is_forgotten() -> None:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    s = Stream("lost", clock.t, 600, 10_000_000)
    agg.on_events([s.slice(0, 512)])
    assert "lost" in agg._itl_live
    clock.advance(700.0)
    agg.tick()
    assert "lost" not in agg._itl_live


async def test_through_the_proxy_a_long_streams_itl_shows_while_it_is_open() -> None:
    """End to end against ``llmtop sim``: a 1,900-token stream (one chunk a token, ~2 ms
    apart); once more than 1,024 of its chunks were written, the aggregator's windows hold
    their ITL samples although the request is still open; after its record, the session
    holds each of its samples once."""
    async with (
        running_sim("tiny", seed=5, time_scale=0.15) as sim,
        observed_proxy(sim.url) as obs,
    ):
        url, agg, records, active = obs.url, obs.agg, obs.records, obs.active
        body = {
            "model": "sim-tiny",
            "max_tokens": 1_900,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "go"}],
        }
        mid = None
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/v1/chat/completions", headers={"X-LLMTOP-User": "rae"}, json=body
            ) as resp,
        ):
            async for _ in resp.content.iter_any():
                open_now = list(active.values())
                if mid is None and open_now and open_now[0].chunks > 1_100:
                    await asyncio.sleep(0.05)  # the bus pump delivers what is published
                    if active:
                        mid = agg.snapshot(10), len(active)
            await resp.read()
        await asyncio.sleep(0.2)
        end = agg.snapshot(None)
    assert mid is not None, "the stream ended before 1,100 chunks"
    snap, still_open = mid
    assert still_open == 1 and snap["system"]["requests"] == 0
    assert snap["latency"]["chunk_gap"]["count"] >= 511
    assert snap["latency"]["itl"]["count"] >= 511
    assert 0.0002 <= snap["latency"]["itl"]["p50"] <= 0.05
    (rec,) = records
    assert len(rec.chunk_offsets_s) > 1_024
    assert end["latency"]["chunk_gap"]["count"] == len(rec.chunk_offsets_s) - 1
    weight = sum(k for k in rec.chunk_tokens[1:] if k > 0)
    assert abs(end["latency"]["itl"]["count"] - weight) <= 1
