"""RequestRecord.itl_samples_s (the per-request ITL P95 reads it): its one-token-a-chunk
shortcut gives exactly the general rule; and the detectors' ITL verdicts, made for a
whole batch of records at once, are each record's own P95 against the limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtop.events import RequestRecord
from llmtop.metrics.slo import FLOAT_SLACK_S
from llmtop.metrics.slo import request_itl_p95 as itl_p95
from llmtop.saturation.signals import itl_missed


def _rule(offs: tuple[float, ...], toks: tuple[int, ...]) -> list[float]:
    """A chunk with k > 0 tokens: k samples of g/k, g from the previous chunk that carried
    tokens (or chunk 0); a chunk with k <= 0 none, and it takes no time."""
    out: list[float] = []
    a = 0
    for i in range(1, len(offs)):
        k = toks[i] if i < len(toks) else 1
        if k > 0:
            out.extend([(offs[i] - offs[a]) / k] * k)
            a = i
    return out


@given(st.lists(st.floats(0, 10), max_size=40).map(lambda xs: tuple(sorted(xs))),
       st.lists(st.sampled_from([1, 1, 1, 1, 2, 0]), max_size=41).map(tuple))
def test_itl_samples_follow_the_rule(offs: tuple[float, ...], toks: tuple[int, ...]) -> None:
    r = RequestRecord(id="r", user="u", model=None, dialect="openai", path="/",
                      stream=True, status=200, outcome="ok", t_start=0.0,
                      ttft_s=offs[0] if offs else None, e2e_s=1.0, prompt_tokens=None,
                      completion_tokens=None, token_source="chunks",
                      chunk_offsets_s=offs, chunk_tokens=toks)
    want = _rule(offs, toks)
    assert r.itl_samples_s() == want
    ones = RequestRecord(**{**{f: getattr(r, f) for f in r.__slots__},  # type: ignore[arg-type]
                            "chunk_tokens": (1,) * len(offs)})
    assert ones.itl_samples_s() == _rule(offs, ())
    assert (itl_p95(r) is None) == (not want)


def _record(i: int, offs: tuple[float, ...], toks: tuple[int, ...], stream: bool = True
            ) -> RequestRecord:
    return RequestRecord(id=f"r{i}", user="u", model=None, dialect="openai", path="/",
                         stream=stream, status=200, outcome="ok", t_start=1.8e9,
                         ttft_s=offs[0] if offs else None, e2e_s=11.0, prompt_tokens=None,
                         completion_tokens=None, token_source="chunks",
                         chunk_offsets_s=offs, chunk_tokens=toks)


_OFFS = st.lists(st.floats(0, 10), max_size=12).map(lambda xs: tuple(sorted(xs)))
_TOKS = st.lists(st.sampled_from([1, 1, 1, 1, 2, 3, 0]), max_size=13).map(tuple)


@given(st.lists(st.tuples(_OFFS, _TOKS, st.booleans()), min_size=1, max_size=8),
       st.sampled_from([0.0, 0.05, 0.5, 2.0]))
def test_batched_verdicts_are_each_records_own(
        recs: list[tuple[tuple[float, ...], tuple[int, ...], bool]], limit: float) -> None:
    records = [_record(i, offs, toks, stream) for i, (offs, toks, stream) in enumerate(recs)]
    want = [(p := itl_p95(r)) is not None and p > limit + FLOAT_SLACK_S for r in records]
    assert itl_missed(records, limit).tolist() == want


def test_a_chunk_of_several_tokens_weighs_as_many_samples() -> None:
    """Two 0.2 s gaps, the second ending in a chunk of 20 tokens: 21 samples, 20 of them
    0.01 s, so the P95 (the 20th) is 0.01 s and a 0.05 s limit is met. Counted one sample
    a chunk, the P95 would be 0.2 s: a miss. The stream beside it misses on every gap."""
    packed = _record(0, (0.0, 0.2, 0.4), (1, 1, 20))
    slow = _record(1, (0.0, 0.2, 0.4), (1, 1, 1))
    assert itl_p95(packed) == 0.01
    assert itl_missed([packed, slow], 0.05).tolist() == [False, True]
    assert itl_missed([slow, packed], 0.005).tolist() == [True, True]


def test_a_non_streamed_answer_never_misses() -> None:
    slow = (0.0, 1.0, 2.0)
    assert itl_missed([_record(0, slow, (), stream=False), _record(1, slow, ())],
                      0.05).tolist() == [False, True]


def test_a_zero_token_chunk_lends_its_time_to_the_next_chunk() -> None:
    """0-token chunks (counts scaled down to the usage) right after the first, two in a
    row and at the end: each token-carrying chunk's gap runs from the last one that
    carried tokens. Here a token every 0.1 s, each just after a 0-token chunk: measured
    from those, the gaps read 0.01 s and the P95 passed a 50 ms limit it misses."""
    offs = (0.0, 0.09, 0.1, 0.15, 0.19, 0.2, 0.29, 0.3, 0.35)
    toks = (1, 0, 1, 0, 0, 1, 0, 1, 0)
    r = _record(0, offs, toks)
    assert r.itl_samples_s() == _rule(offs, toks)
    assert r.itl_samples_s() == pytest.approx([0.1] * 3)
    assert sum(r.itl_samples_s()) == pytest.approx(offs[7] - offs[0])
    assert itl_p95(r) == pytest.approx(0.1)
    assert itl_missed([r], 0.05).tolist() == [True]
    assert itl_missed([r], 0.101).tolist() == [False]
