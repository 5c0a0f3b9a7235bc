"""The vectorised HDR histogram against hdrh's own per-value results."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.metrics import hdr
from llmtop.metrics.hdr import (
    COUNTS_LEN,
    HIGHEST,
    Histogram,
    HistogramDecodeError,
    bucket_index,
    decode_sparse,
    encode_many,
    encode_sparse,
    seconds_to_us,
    summary_seconds,
)

PERCENTILES = [0.0, 0.1, 1.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0]

values_us = st.lists(
    st.one_of(
        st.integers(0, 5000),
        st.integers(0, 10_000_000),
        st.integers(0, HIGHEST),
    ),
    min_size=1,
    max_size=300,
)


def reference(values: list[int], counts: list[int] | None = None) -> HdrHistogram:
    h = HdrHistogram(1, HIGHEST, 3)
    for i, v in enumerate(values):
        assert h.record_value(v, 1 if counts is None else counts[i])
    return h


def test_layout_matches_hdrh() -> None:
    h = HdrHistogram(hdr.LOWEST, hdr.HIGHEST, hdr.SIGNIFICANT)
    assert h.counts_len == COUNTS_LEN
    assert h.sub_bucket_count == hdr.SUB_BUCKET_COUNT
    assert h.bucket_count == hdr.BUCKET_COUNT
    idx = np.arange(COUNTS_LEN)
    sample = idx[:: 97]
    for i in sample:
        v = h.get_value_from_index(int(i))
        assert hdr.LOWEST_EQ[i] == v
        assert hdr.HIGHEST_EQ[i] == h.get_highest_equivalent_value(v)


@settings(max_examples=60, deadline=None)
@given(values_us, st.data())
def test_record_and_percentiles_equal_hdrh(values: list[int], data: st.DataObject) -> None:
    counts = data.draw(st.lists(st.integers(1, 1000), min_size=len(values), max_size=len(values)))
    ref = reference(values, counts)
    h = Histogram()
    h.record_us(values, counts)
    assert np.array_equal(h.counts, np.ctypeslib.as_array(ref.counts))
    assert h.total == ref.get_total_count()
    # hdrh's one-pass dict walks the same buckets as get_value_at_percentile (checked once)
    want = ref.get_percentile_to_value_dict(PERCENTILES)
    assert h.percentiles(PERCENTILES) == [want[p] for p in PERCENTILES]
    assert h.value_at_percentile(99.0) == ref.get_value_at_percentile(99.0)
    assert h.max() == ref.get_max_value()
    assert h.min() == ref.get_min_value()


@settings(max_examples=100, deadline=None)
@given(values_us)
def test_bucket_index_equals_hdrh(values: list[int]) -> None:
    ref = HdrHistogram(1, HIGHEST, 3)
    got = bucket_index(np.array(values, dtype=np.int64))
    assert got.tolist() == [ref._counts_index_for(v) for v in values]


@settings(max_examples=40, deadline=None)
@given(values_us)
def test_encoding_is_byte_identical_to_hdrh(values: list[int]) -> None:
    ref = reference(values)
    h = Histogram()
    h.record_us(values)
    text = h.encode()
    assert text == ref.encode().decode()
    assert Histogram.decode(text) == h
    # and hdrh decodes ours to the same counts
    back = HdrHistogram.decode(text)
    assert back.get_total_count() == len(values)
    want = back.get_percentile_to_value_dict(PERCENTILES)
    assert [want[p] for p in PERCENTILES] == h.percentiles(PERCENTILES)


def test_empty_histogram_encodes_and_decodes() -> None:
    h = Histogram()
    text = h.encode()
    assert text == HdrHistogram(1, HIGHEST, 3).encode().decode()
    idx, cnt = decode_sparse(text)
    assert len(idx) == 0 and len(cnt) == 0
    assert summary_seconds(idx, cnt)["p95"] is None


def test_decodes_other_layouts_by_value() -> None:
    """A histogram from a library with other settings is re-bucketed by value."""
    other = HdrHistogram(1000, 60_000_000, 2)
    vals = [1500, 25_000, 250_000, 1_000_000, 59_000_000]
    for v in vals:
        other.record_value(v)
    idx, cnt = decode_sparse(other.encode().decode())
    assert int(cnt.sum()) == len(vals)
    # each value lands on the other layout's bucket value, which ours represents exactly
    assert hdr.LOWEST_EQ[idx].tolist() == [other.get_lowest_equivalent_value(v) for v in vals]


def test_out_of_range_values_are_clamped_and_counted() -> None:
    h = Histogram()
    h.record_us([-5, 10, HIGHEST + 1, 2 * HIGHEST])
    assert h.clamped == 3
    assert h.total == 4
    assert h.max() == int(hdr.HIGHEST_EQ[bucket_index(np.array([HIGHEST]))[0]])
    assert h.min() == 0
    us, bad = seconds_to_us([0.0000004, 1e9, float("nan"), -1.0, 0.25])
    assert bad == 3
    assert us.tolist() == [0, HIGHEST, 0, 250_000]


def test_record_seconds_rounds_to_microseconds() -> None:
    h = Histogram()
    h.record_seconds([0.0123454, 0.0123456, 1.0], [1, 2, 3])
    ref = reference([12345, 12346, 1_000_000], [1, 2, 3])
    assert np.array_equal(h.counts, np.ctypeslib.as_array(ref.counts))


@pytest.mark.parametrize("bad", ["", "not base64!", base64.b64encode(b"x" * 40).decode(),
                                 base64.b64encode(b"\x1c\x84\x93\x14\x00\x00\x00\x05abcde").decode()])
def test_decode_rejects_garbage(bad: str) -> None:
    with pytest.raises(HistogramDecodeError):
        decode_sparse(bad)


@settings(max_examples=50, deadline=None)
@given(values_us, values_us)
def test_merge_equals_one_histogram(a: list[int], b: list[int]) -> None:
    ha, hb, hab = Histogram(), Histogram(), Histogram()
    ha.record_us(a)
    hb.record_us(b)
    hab.record_us(a + b)
    merged = Histogram.merged([ha, hb])
    assert merged == hab
    idx, cnt = decode_sparse(encode_sparse(*merged.sparse()))
    assert Histogram.from_sparse(idx, cnt) == hab


def test_mean_equals_hdrh() -> None:
    vals = [3, 900, 2049, 77_777, 1_234_567, 999_999_999]
    h = Histogram()
    h.record_us(vals, [5, 1, 2, 3, 1, 1])
    ref = reference(vals, [5, 1, 2, 3, 1, 1])
    assert h.mean() == pytest.approx(ref.get_mean_value(), rel=1e-12)


def test_summary_in_seconds() -> None:
    h = Histogram()
    h.record_us(list(range(1, 101)))
    s = summary_seconds(*h.sparse())
    assert s["count"] == 100
    assert s["p50"] == 50 / 1e6
    assert s["p99"] == 99 / 1e6
    assert s["max"] == 100 / 1e6
    assert s["mean"] == pytest.approx(50.5 / 1e6)


@settings(max_examples=60, deadline=None)
@given(st.lists(values_us, min_size=1, max_size=6), st.data())
def test_encode_many_equals_one_by_one(groups: list[list[int]], data: st.DataObject) -> None:
    """Several histograms encoded in one vectorised pass (some may be empty)."""
    hists = []
    for vals in groups:
        h = Histogram()
        if data.draw(st.booleans()):
            h.record_us(vals)
        hists.append(h)
    keys = np.concatenate([h.sparse()[0] + j * COUNTS_LEN for j, h in enumerate(hists)])
    counts = np.concatenate([h.sparse()[1] for h in hists])
    assert encode_many(keys, counts, len(hists)) == [h.encode() for h in hists]
