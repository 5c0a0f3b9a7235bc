"""QA: when a 32k–64k-event answer ended, every other stream through the proxy stalled
21–61 ms while ``Exchange.to_record`` built its record element by element on the
forwarding loop (the rescale sorted every chunk index). Long streams are now built in bulk
(llmtop/proxy/chunk_math.py): the record must be EXACTLY the one the old code built — same
values, same element types (tuples of Python floats and ints). The old code is copied here
as the reference; benchmarks/record_cost.py prints what the new one costs."""

from __future__ import annotations

import random
from array import array
from dataclasses import replace
from time import perf_counter_ns

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.bench.client import BenchClient, _Attempt
from llmtop.bench.workload import BenchRequest
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.proxy import chunk_math
from llmtop.proxy.chunk_math import BULK, ChunkCounts, scale_tokens, seconds_since
from llmtop.proxy.relay import HOLD_AT, Exchange
from llmtop.proxy.token_rate import TokenRates

# -- the reference: relay.py's code before the bulk path (commit 6cddb4c) ----------------


def old_scale_tokens(counts: list[int], total: int) -> list[int]:
    n = len(counts)
    if n == 0:
        return []
    total = max(total, 0)
    have = sum(counts)
    if have == total:
        return list(counts)
    if have == 0:
        return old_share([1] * n, total)
    if total == 0:
        return [0] * n
    first = 1 if counts[0] > 0 else 0
    weights = [counts[0] - first, *counts[1:]]
    if sum(weights) == 0:
        weights = [1] * n
    out = old_share(weights, total - first)
    out[0] += first
    return out


def old_share(weights: list[int], total: int) -> list[int]:
    n, wsum = len(weights), sum(weights)
    base = [w * total // wsum for w in weights]
    left = total - sum(base)
    if left:
        order = sorted(range(n), key=lambda i: (-(weights[i] * total % wsum), i))
        for i in order[:left]:
            base[i] += 1
    return base


def old_offsets(offsets: list[int], t0: int) -> tuple[float, ...]:
    return tuple([(o - t0) / 1e9 for o in offsets])


# -- helpers ---------------------------------------------------------------------------


def same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Equal element by element, with the same Python types (1 == 1.0 is not enough)."""
    return len(a) == len(b) and all(type(x) is type(y) and x == y for x, y in zip(a, b,
                                                                                  strict=True))


def counts_like(rng: random.Random, n: int, kind: str) -> list[int]:
    if kind == "ones":
        return [1] * n
    if kind == "zeros":
        return [0] * n
    if kind == "small":
        return [rng.randint(0, 4) for _ in range(n)]
    if kind == "first-zero":
        return [0] + [rng.randint(1, 3) for _ in range(n - 1)]
    if kind == "first-only":
        return [rng.randint(1, 5)] + [0] * (n - 1)
    return [rng.choice((0, 1, 1, 1, 2, 7, 300)) for _ in range(n)]


def totals_for(rng: random.Random, counted: int, n: int) -> list[int]:
    return [counted, counted + 1, counted - 1, counted + 17, 3 * counted + 5, 0, -4, 1,
            rng.randint(0, 4 * n + 10), n, n - 1]


KINDS = ("ones", "zeros", "small", "first-zero", "first-only", "mixed")
SIZES = (1, 2, 7, BULK - 1, BULK, BULK + 1, 511, 512, 513, 2000, 9000)


# -- scaling ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_scale_tokens_equals_the_old_code_on_random_counts(n: int) -> None:
    rng = random.Random(n)
    for kind in KINDS:
        counts = counts_like(rng, n, kind)
        for total in totals_for(rng, sum(counts), n):
            want = old_scale_tokens(counts, total)
            got = scale_tokens(counts, total)
            assert got == want, (n, kind, total)
            assert all(type(k) is int for k in got)
            # the record's path: packed part + list part, as an open stream holds them
            cut = rng.randint(0, n)
            cc = ChunkCounts(array("q", counts[:cut]), counts[cut:])
            assert cc.counted == sum(counts) and len(cc) == n
            assert same(cc.scaled(total), tuple(want)), (n, kind, total, cut)
            assert same(cc.scaled(None), tuple(counts))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=700), st.integers(-3, 20_000))
def test_bulk_scaling_equals_the_old_code_at_any_length(counts: list[int], total: int) -> None:
    """The numpy path itself (whatever BULK is), against the reference."""
    got = chunk_math._scale_bulk(np.array(counts, dtype=np.int64), total)
    assert got is not None
    assert got.tolist() == old_scale_tokens(counts, total)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=400), st.integers(0, 2000))
def test_bulk_share_ties_go_to_the_earlier_index(weights: list[int], total: int) -> None:
    """Few distinct weights: many equal remainders, so the tie rule decides."""
    if sum(weights) == 0:
        weights[0] = 1
    got = chunk_math._share_bulk(np.array(weights, dtype=np.int64), total)
    assert got.tolist() == old_share(weights, total)


def test_the_usual_vllm_rescale_gives_the_extra_token_to_the_second_chunk() -> None:
    """Usage = events + 1 (the stop token had no delta): one chunk takes two."""
    n = 20_000
    out = ChunkCounts(array("q", [1] * n)).scaled(n + 1)
    assert out[:3] == (1, 2, 1) and sum(out) == n + 1 and set(out[3:]) == {1}


def test_counts_out_of_int64_reach_fall_back_to_python() -> None:
    counts = [2**40] * (BULK + 3)
    total = 2**40 * len(counts) + 12345
    assert chunk_math._scale_bulk(np.array(counts, dtype=np.int64), total) is None
    assert scale_tokens(counts, total) == old_scale_tokens(counts, total)
    negative = [1, -1] * BULK
    assert scale_tokens(negative, 7) == old_scale_tokens(negative, 7)


# -- chunk times -----------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_offsets_in_seconds_equal_the_old_code(n: int) -> None:
    rng = random.Random(1000 + n)
    for t0 in (perf_counter_ns(), 0, 10**12, 2**62 - 2**54, rng.randint(0, 2**60)):
        times = [t0 + rng.randint(-(10**9), 2**53) for _ in range(n)]
        if n > 3:  # whole-second, sub-microsecond and big differences
            times[:4] = [t0, t0 + 10**9, t0 + 1, t0 + 2**53 - 1]
        want = old_offsets(times, t0)
        cut = rng.randint(0, n)
        assert same(seconds_since(t0, times), want)
        assert same(seconds_since(t0, array("q", times[:cut]), times[cut:]), want)
        assert same(seconds_since(t0, None, times), want)
        assert same(seconds_since(t0, array("q", times)), want)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**62), st.lists(st.integers(-(2**40), 2**62 - 1), min_size=BULK,
                                       max_size=BULK + 50))
def test_bulk_offsets_are_bit_for_bit_those_of_python(t0: int, diffs: list[int]) -> None:
    """Differences up to 2**62 ns (beyond 2**53 the double is rounded: the same way); times
    stay within int64, as perf_counter_ns does."""
    times = [t0 + d for d in diffs]
    assert same(seconds_since(t0, array("q", times)), old_offsets(times, t0))


def test_the_packed_times_are_left_as_they_were() -> None:
    times = array("q", range(10**12, 10**12 + 3 * BULK))
    before = times.tobytes()
    seconds_since(10**12 - 5, times)
    ChunkCounts(times).scaled(7)
    assert times.tobytes() == before


# -- whole records ---------------------------------------------------------------------


class _Parser:
    def __init__(self, usage: int | None) -> None:
        self.usage_completion_tokens = usage
        self.usage_prompt_tokens = 37
        self.model = "m"
        self.response_id = None  # (the old record had no upstream_id)
        self.error = None
        self.ended = True


def _exchange(times: list[int], toks: list[int], t0: int, usage: int | None) -> Exchange:
    a = ActiveRequest(id="r", user="u", model="m", dialect="openai",
                      path="/v1/chat/completions", stream=True, t_start=1.0e9, t0_ns=t0)
    ex = Exchange(a)
    for t, k in zip(times, toks, strict=True):
        ex.offsets.append(t)
        ex.tokens.append(k)
        if len(ex.tokens) >= HOLD_AT:
            ex.hold()
    ex.end_ns = (times[-1] if times else t0) + 1234
    ex.stream = True
    ex.status = 200
    ex.parser = _Parser(usage)  # type: ignore[assignment]
    return ex


def _old_record(ex: Exchange, times: list[int], toks: list[int], rates: TokenRates | None
                ) -> RequestRecord:
    """What the old ``to_record`` gave: the new record with the per-chunk fields redone
    by the reference code (the other fields' code did not change)."""
    rec = ex.to_record(rates)
    t0 = ex.active.t0_ns
    counts = toks if rec.token_source == "chunks" else old_scale_tokens(
        toks, rec.completion_tokens or 0)
    return replace(rec, ttft_s=(times[0] - t0) / 1e9 if times else None,
                   chunk_offsets_s=old_offsets(times, t0), chunk_tokens=tuple(counts))


@pytest.mark.parametrize("n", [0, 1, 300, HOLD_AT, 3 * HOLD_AT + 17, 16_384])
@pytest.mark.parametrize("extra", [None, 0, 1, 1000])
def test_to_record_equals_the_old_record(n: int, extra: int | None) -> None:
    rng = random.Random(n * 7 + (extra or 0))
    t0 = perf_counter_ns()
    times = sorted(t0 + rng.randint(10**6, 10**11) for _ in range(n))
    toks = [rng.choice((1, 1, 1, 2, 0)) for _ in range(n)]
    usage = None if extra is None else sum(toks) + extra
    ex = _exchange(times, toks, t0, usage)
    rec = ex.to_record()
    want = _old_record(ex, times, toks, None)
    assert rec == want
    assert same(rec.chunk_offsets_s, want.chunk_offsets_s)
    assert same(rec.chunk_tokens, want.chunk_tokens)
    assert rec.ttft_s == want.ttft_s and type(rec.ttft_s) is type(want.ttft_s)


def test_to_record_estimate_path_equals_the_old_record() -> None:
    """A stream without usage, scaled by the tokens per event its model taught."""
    rates = TokenRates()
    t0 = perf_counter_ns()
    n = 2 * HOLD_AT + 5
    times = [t0 + 10**7 * (i + 1) for i in range(n)]
    rates.learn("m", 3 * n, n)
    ex = _exchange(times, [1] * n, t0, None)
    rec = ex.to_record(rates)
    assert rec.token_source == "estimate"
    want = _old_record(ex, times, [1] * n, rates)
    assert same(rec.chunk_tokens, want.chunk_tokens) and sum(rec.chunk_tokens) > n


@pytest.mark.parametrize("usage_extra", [None, 0, 1])
def test_bench_record_equals_the_old_record(usage_extra: int | None) -> None:
    rng = random.Random(5)
    n = 5000
    t0 = perf_counter_ns()
    times = sorted(t0 + rng.randint(10**6, 10**10) for _ in range(n))
    toks = [1] * n
    at = _Attempt()
    at.status = 200
    at.offsets = array("q", times)
    at.counts = array("q", toks)
    usage = None if usage_extra is None else n + usage_extra
    at.parser = _Parser(usage)  # type: ignore[assignment]
    client = BenchClient("http://127.0.0.1:1")
    rec = client._record(t0, 1.0e9, t0 + 10**11, "ok", None, at,
                         BenchRequest(prompt="p", prompt_tokens_target=1, max_tokens=n), 3)
    want_tokens = tuple(toks if usage is None else old_scale_tokens(toks, usage))
    assert same(rec.chunk_offsets_s, tuple((o - t0) / 1e9 for o in times))
    assert same(rec.chunk_tokens, want_tokens)
    assert rec.ttft_s == (times[0] - t0) / 1e9
    assert rec.completion_tokens == (n if usage is None else usage)
    assert rec.token_source == ("chunks" if usage is None else "usage")


@settings(max_examples=300, deadline=None)
@given(toks=st.lists(st.integers(0, 5), max_size=BULK + 3),
       usage=st.one_of(st.none(), st.integers(-3, 4 * BULK)),
       rate=st.one_of(st.none(), st.integers(2, 4)))
def test_a_short_streams_record_equals_the_general_way(
        toks: list[int], usage: int | None, rate: int | None) -> None:
    """A stream whose chunks are all still in the lists (no ``hold`` yet) and fewer than
    ``BULK`` gets its per-chunk figures in plain Python in ``to_record``; the record is
    exactly the one of the general way (ChunkCounts over the packed and listed parts),
    reached here by giving the same exchange empty packed parts."""
    t0 = perf_counter_ns()
    times = [t0 + 10**6 * (i + 1) + 7 * i * i for i in range(len(toks))]
    short = _exchange(times, toks, t0, usage)
    general = _exchange(times, toks, t0, usage)
    general.held_offsets, general.held_tokens = array("q"), array("q")
    rates_a, rates_b = TokenRates(), TokenRates()
    if rate is not None:
        for r in (rates_a, rates_b):
            r.learn("m", rate * 100, 100)
    a, b = short.to_record(rates_a), general.to_record(rates_b)
    assert a == b
    assert same(a.chunk_offsets_s, b.chunk_offsets_s)
    assert same(a.chunk_tokens, b.chunk_tokens)
    assert type(a.completion_tokens) is type(b.completion_tokens)
