"""HDR histograms of microseconds, vectorised with numpy — the only module importing ``hdrh``.

Layout: HdrHistogram with lowest trackable value 1 µs, highest 1 h (3.6e9 µs) and 3
significant digits, i.e. exactly ``hdrh.histogram.HdrHistogram(1, 3_600_000_000, 3)``:
2048 sub-buckets, 22 buckets, 23,552 counts. Index ``i`` of the counts array covers the
integer values ``LOWEST_EQ[i] .. HIGHEST_EQ[i]``.

Why not hdrh itself on the hot path: its ``record_value`` and ``get_value_at_percentile``
are pure-Python per value and per bucket. Here a batch of values is bucketed in one numpy
call (:func:`bucket_index`), and every percentile of a histogram comes from one
``cumsum`` + ``searchsorted`` (:func:`sparse_percentiles`). Results are identical to
hdrh's (``get_value_at_percentile``: the highest equivalent value of the bucket holding
the target count; the lowest for percentile 0) — the tests check it with hypothesis.

Values outside 0 µs .. 1 h are clamped into range and counted (never silently dropped);
NaN is dropped and counted. Sub-microsecond values round to 0 µs (hdrh's index 0).

Encoding is HdrHistogram's standard V2 compressed base64 form ("HISTFAAA..."): any
HdrHistogram library (Java, C, Go, Rust, hdrh) decodes it. :func:`encode_sparse` writes
it with numpy + zlib, byte-identical to ``hdrh``'s ``encode()``; decoding goes through
hdrh's C decoder and accepts histograms of any layout (re-bucketed when it differs).

Histograms in windows are kept sparse (sorted indices + counts, see
:mod:`llmtop.metrics.table`): a dense counts array is 184 KiB.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from hdrh.histogram import HdrHistogram

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

LOWEST: Final = 1
"""Lowest discernible value (µs)."""
HIGHEST: Final = 3_600_000_000
"""Highest trackable value (µs): one hour. Larger values are clamped to it and counted."""
SIGNIFICANT: Final = 3
SUB_BUCKET_HALF_COUNT_MAG: Final = 10
SUB_BUCKET_HALF_COUNT: Final = 1 << SUB_BUCKET_HALF_COUNT_MAG  # 1024
SUB_BUCKET_COUNT: Final = 2 * SUB_BUCKET_HALF_COUNT  # 2048
SUB_BUCKET_MASK: Final = SUB_BUCKET_COUNT - 1
BUCKET_COUNT: Final = 22
COUNTS_LEN: Final = (BUCKET_COUNT + 1) * SUB_BUCKET_HALF_COUNT  # 23552

_ENCODING_COOKIE: Final = 0x1C849303 | 0x10
_COMPRESSION_COOKIE: Final = 0x1C849304 | 0x10
_PAYLOAD_HEADER: Final = struct.Struct(">IIIIQQd")
_EXTERNAL_HEADER: Final = struct.Struct(">II")


class HistogramDecodeError(ValueError):
    """The text is not a decodable HdrHistogram (base64 / cookie / zlib / length)."""


# -- value <-> index ------------------------------------------------------------------------


def bucket_index(us: npt.ArrayLike) -> I64:
    """Counts-array index of each value (int µs in 0..HIGHEST), vectorised.

    Same arithmetic as hdrh's ``_counts_index_for``: the bucket is the bit length of
    ``value | sub_bucket_mask`` minus 11, the sub-bucket ``value >> bucket``.
    """
    v = np.asarray(us, dtype=np.int64)
    _, bitlen = np.frexp((v | SUB_BUCKET_MASK).astype(np.float64))  # exact below 2**53
    bucket = bitlen.astype(np.int64) - (SUB_BUCKET_HALF_COUNT_MAG + 1)
    sub = v >> bucket
    return ((bucket + 1) << SUB_BUCKET_HALF_COUNT_MAG) + sub - SUB_BUCKET_HALF_COUNT


def _index_tables() -> tuple[I64, I64, I64]:
    idx = np.arange(COUNTS_LEN, dtype=np.int64)
    bucket = (idx >> SUB_BUCKET_HALF_COUNT_MAG) - 1
    sub = (idx & (SUB_BUCKET_HALF_COUNT - 1)) + SUB_BUCKET_HALF_COUNT
    first = bucket < 0
    sub = np.where(first, sub - SUB_BUCKET_HALF_COUNT, sub)
    bucket = np.where(first, 0, bucket)
    lowest = sub << bucket
    size = np.int64(1) << bucket
    return lowest, lowest + size - 1, lowest + (size >> 1)


LOWEST_EQ, HIGHEST_EQ, MEDIAN_EQ = _index_tables()
"""Per index: lowest / highest / median equivalent value (µs), as hdrh defines them."""
LOWEST_EQ.flags.writeable = False
HIGHEST_EQ.flags.writeable = False
MEDIAN_EQ.flags.writeable = False


def seconds_to_us(values_s: npt.ArrayLike) -> tuple[I64, int]:
    """Seconds → whole microseconds clamped to 0..HIGHEST; NaN dropped.

    Returns ``(µs, n_out_of_range)`` where the count includes clamped and dropped values.
    """
    x = np.asarray(values_s, dtype=np.float64) * 1e6
    bad = 0
    nan = np.isnan(x)
    if nan.any():
        bad += int(nan.sum())
        x = x[~nan]
    us = np.rint(x)
    out = (us < 0) | (us > HIGHEST)
    if out.any():
        bad += int(out.sum())
        us = np.clip(us, 0, HIGHEST)
    return us.astype(np.int64), bad


def clamp_us(values_us: npt.ArrayLike) -> tuple[I64, int]:
    """Integer µs clamped to 0..HIGHEST, with how many were out of range."""
    v = np.asarray(values_us, dtype=np.int64)
    out = (v < 0) | (v > HIGHEST)
    n = int(out.sum())
    if n:
        v = np.clip(v, 0, HIGHEST)
    return v, n


# -- percentiles -------------------------------------------------------------------------


def count_at_percentile(p: float, total: int) -> int:
    """hdrh's target count for percentile ``p`` of ``total`` values (at least 1)."""
    return max(int((min(p, 100.0) * total / 100) + 0.5), 1)


def sparse_percentiles(idx: I64, counts: I64, ps: Sequence[float]) -> list[int]:
    """Values (µs) at percentiles ``ps`` of a histogram given by sorted indices and counts.

    One cumsum and one searchsorted for all percentiles. Empty histogram: all 0 (hdrh's
    convention; callers map an empty histogram to ``None``).
    """
    if len(idx) == 0:
        return [0 for _ in ps]
    cum = np.cumsum(counts)
    total = int(cum[-1])
    targets = np.array([count_at_percentile(p, total) for p in ps], dtype=np.int64)
    pos = np.searchsorted(cum, targets, side="left")
    at = idx[np.minimum(pos, len(idx) - 1)]
    return [int(LOWEST_EQ[i] if p == 0 else HIGHEST_EQ[i]) for p, i in zip(ps, at, strict=True)]


# -- encoding ----------------------------------------------------------------------------

def _zigzag_leb128(tokens: I64) -> bytes:
    """HdrHistogram's ZigZag LEB128 (64b9B) of each int64, for |v| < 2**55."""
    return _leb128_parts(tokens)[0].tobytes()


def _leb128_parts(tokens: I64) -> tuple[npt.NDArray[np.uint8], I64]:
    """The encoded bytes and where each token's bytes start.

    Byte plane by byte plane: byte k of every value that has one is written at its
    position in one pass, so the cost is O(n × bytes of the largest value).
    """
    n = len(tokens)
    if n == 0:
        return np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64)
    z = ((tokens << 1) ^ (tokens >> 63)).view(np.uint64)
    zmax = int(z.max())
    if zmax >= 1 << 56:
        raise ValueError("count too large to encode")
    maxb = max(1, (zmax.bit_length() + 6) // 7)
    nb = np.ones(n, dtype=np.int64)
    for k in range(1, maxb):
        nb += z >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nb)
    pos = ends - nb
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    seven, low7 = np.uint64(7), np.uint64(0x7F)
    zz = z
    sel = np.arange(n)
    for k in range(maxb):
        if k:
            keep = nb[sel] > k
            sel = sel[keep]
            zz = zz[keep] >> seven
        byte = (zz & low7).astype(np.uint8)
        byte |= (nb[sel] > k + 1).astype(np.uint8) << 7
        out[pos[sel] + k] = byte
    return out, pos


def _wrap(body: bytes) -> str:
    header = _PAYLOAD_HEADER.pack(_ENCODING_COOKIE, len(body), 0, SIGNIFICANT, LOWEST, HIGHEST, 1.0)
    cpayload = zlib.compress(header + body)
    blob = _EXTERNAL_HEADER.pack(_COMPRESSION_COOKIE, len(cpayload)) + cpayload
    return base64.b64encode(blob).decode("ascii")


def encode_many(keys: I64, counts: I64, n: int) -> list[str]:
    """Encode ``n`` histograms packed in one sorted array (``key = j * COUNTS_LEN + index``
    for histogram ``j``) in one vectorised pass; equals ``encode_sparse`` of each."""
    keep = counts != 0
    if not keep.all():
        keys, counts = keys[keep], counts[keep]
    m = len(keys)
    if m == 0:
        return [_wrap(b"") for _ in range(n)]
    hist = keys // COUNTS_LEN
    idx = keys - hist * COUNTS_LEN
    prev = np.empty(m, dtype=np.int64)
    prev[0] = -1
    prev[1:] = idx[:-1]
    prev[1:][hist[1:] != hist[:-1]] = -1
    gaps = idx - prev - 1
    has_gap = gaps > 0
    count_pos = np.arange(m) + np.cumsum(has_gap)
    tokens = np.empty(m + int(has_gap.sum()), dtype=np.int64)
    tokens[count_pos] = counts
    tokens[count_pos[has_gap] - 1] = -gaps[has_gap]
    data, pos = _leb128_parts(tokens)
    first_entry = np.searchsorted(hist, np.arange(n + 1))
    first_token = np.append(count_pos - has_gap, len(tokens))[first_entry]
    byte_at = np.append(pos, len(data))[first_token].tolist()
    raw = data.tobytes()
    return [_wrap(raw[byte_at[j]:byte_at[j + 1]]) for j in range(n)]


def encode_sparse(idx: I64, counts: I64) -> str:
    """V2 compressed base64 of the histogram with counts ``counts`` at sorted indices ``idx``.

    Zero counts are allowed (skipped). Byte-identical to hdrh's ``encode()`` of the same
    histogram: each run of zero counts is written as its negated length (hdrh writes a
    single zero as -1 where Java writes 0; every decoder reads both).
    """
    keep = counts != 0
    if not keep.all():
        idx, counts = idx[keep], counts[keep]
    if len(idx):
        gaps = np.diff(idx, prepend=-1) - 1
        has_gap = gaps > 0
        n_gap = int(has_gap.sum())
        tokens = np.empty(len(idx) + n_gap, dtype=np.int64)
        count_pos = np.arange(len(idx)) + np.cumsum(has_gap)
        tokens[count_pos] = counts
        gap_pos = count_pos[has_gap] - 1
        g = gaps[has_gap]
        tokens[gap_pos] = -g
        body = _zigzag_leb128(tokens)
    else:
        body = b""
    return _wrap(body)


def decode_sparse(text: str) -> tuple[I64, I64]:
    """Decode any V2 compressed base64 HdrHistogram into this layout: ``(idx, counts)``.

    Histograms with the same unit and precision map index for index; others (another
    library's settings) are re-bucketed by their bucket values. Raises
    :class:`HistogramDecodeError` on malformed input.
    """
    if not isinstance(text, str | bytes) or not text:
        raise HistogramDecodeError("empty histogram text")
    try:
        h: Any = HdrHistogram.decode(text)
    except (binascii.Error, zlib.error, ValueError, TypeError, IndexError) as exc:
        raise HistogramDecodeError(f"not an HdrHistogram: {exc}") from None
    except Exception as exc:  # hdrh's own cookie/length exceptions
        raise HistogramDecodeError(f"not an HdrHistogram: {type(exc).__name__} {exc}") from None
    n = int(h.counts_len)
    dense = np.ctypeslib.as_array(h.counts, shape=(n,)).astype(np.int64)
    nz = np.flatnonzero(dense)
    cnt = dense[nz]
    if (cnt < 0).any():
        raise HistogramDecodeError("negative counts")
    same = h.unit_magnitude == 0 and h.sub_bucket_half_count_magnitude == SUB_BUCKET_HALF_COUNT_MAG
    if same and (len(nz) == 0 or nz[-1] < COUNTS_LEN):
        return nz.astype(np.int64), cnt
    # different layout: map each non-empty bucket's value into ours
    um, mag = int(h.unit_magnitude), int(h.sub_bucket_half_count_magnitude)
    half = 1 << mag
    bucket = (nz >> mag) - 1
    sub = (nz & (half - 1)) + half
    first = bucket < 0
    sub = np.where(first, sub - half, sub)
    bucket = np.where(first, 0, bucket)
    values = sub.astype(np.int64) << (bucket + um)
    v, _ = clamp_us(values)
    return compact(bucket_index(v), cnt)


def compact(idx: I64, counts: I64) -> tuple[I64, I64]:
    """Sum duplicate indices: sorted unique indices and their counts."""
    if len(idx) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(idx, kind="stable")
    s, c = idx[order], counts[order]
    start = np.flatnonzero(np.diff(s, prepend=-1) != 0)
    return s[start], np.add.reduceat(c, start)


# -- a typed dense histogram ---------------------------------------------------------------


class Histogram:
    """A dense HDR histogram of microseconds (1 µs .. 1 h, 3 significant digits).

    Cheap to record into in batches; percentiles in one pass; mergeable; encodes to the
    standard V2 form. For many small per-interval histograms use sparse tables instead.
    """

    __slots__ = ("clamped", "counts")

    def __init__(self) -> None:
        self.counts: I64 = np.zeros(COUNTS_LEN, dtype=np.int64)
        self.clamped = 0
        """Values recorded out of range (clamped) or dropped (NaN)."""

    # recording
    def record_us(self, values_us: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> None:
        """Record integer microsecond values (each ``counts[i]`` times, default once)."""
        v, bad = clamp_us(values_us)
        self.clamped += bad
        if v.size == 0:
            return
        w = None if counts is None else np.asarray(counts, dtype=np.int64)
        add = np.bincount(bucket_index(v), weights=w, minlength=COUNTS_LEN)
        self.counts += add.astype(np.int64)

    def record_seconds(self, values_s: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> None:
        """Record values in seconds (rounded to whole µs)."""
        x = np.asarray(values_s, dtype=np.float64)
        w = None if counts is None else np.asarray(counts, dtype=np.int64)
        if w is not None:
            keep = ~np.isnan(x)
            x, w = x[keep], w[keep]
            self.clamped += int((~keep).sum())
        us, bad = seconds_to_us(x)
        self.clamped += bad
        if us.size:
            add = np.bincount(bucket_index(us), weights=w, minlength=COUNTS_LEN)
            self.counts += add.astype(np.int64)

    def add(self, other: Histogram) -> None:
        """Merge ``other`` into this histogram."""
        self.counts += other.counts
        self.clamped += other.clamped

    def add_sparse(self, idx: I64, counts: I64) -> None:
        np.add.at(self.counts, idx, counts)

    # reading
    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def sparse(self) -> tuple[I64, I64]:
        nz = np.flatnonzero(self.counts)
        return nz.astype(np.int64), self.counts[nz]

    def percentiles(self, ps: Sequence[float]) -> list[int]:
        """Values (µs) at each percentile, as hdrh's ``get_value_at_percentile``."""
        return sparse_percentiles(*self.sparse(), ps)

    def value_at_percentile(self, p: float) -> int:
        return self.percentiles([p])[0]

    def max(self) -> int:
        """hdrh's ``get_max_value()``: the highest equivalent value of the top bucket."""
        nz = np.flatnonzero(self.counts)
        return int(HIGHEST_EQ[nz[-1]]) if len(nz) else 0

    def min(self) -> int:
        nz = np.flatnonzero(self.counts)
        return int(LOWEST_EQ[nz[0]]) if len(nz) else 0

    def mean(self) -> float:
        """hdrh's ``get_mean_value()`` (bucket medians weighted by counts)."""
        t = self.total
        return float((self.counts * MEDIAN_EQ).sum()) / t if t else 0.0

    # transport
    def encode(self) -> str:
        return encode_sparse(*self.sparse())

    @classmethod
    def decode(cls, text: str) -> Histogram:
        h = cls()
        h.add_sparse(*decode_sparse(text))
        return h

    @classmethod
    def from_sparse(cls, idx: I64, counts: I64) -> Histogram:
        h = cls()
        h.add_sparse(idx, counts)
        return h

    @classmethod
    def merged(cls, hists: Iterable[Histogram]) -> Histogram:
        out = cls()
        for h in hists:
            out.add(h)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Histogram) and bool(np.array_equal(self.counts, other.counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Histogram(total={self.total}, max_us={self.max()})"


def summary_seconds(idx: I64, counts: I64) -> dict[str, float | int | None]:
    """The snapshot's latency summary of a sparse histogram, in seconds.

    ``{"count", "p50", "p90", "p95", "p99", "max", "mean"}``; percentiles ``None`` when empty.
    """
    total = int(counts.sum()) if len(counts) else 0
    if total == 0:
        return {"count": 0, "p50": None, "p90": None, "p95": None, "p99": None,
                "max": None, "mean": None}
    p50, p90, p95, p99, mx = sparse_percentiles(idx, counts, (50, 90, 95, 99, 100))
    mean = float((counts * MEDIAN_EQ[idx]).sum()) / total
    return {"count": total, "p50": p50 / 1e6, "p90": p90 / 1e6, "p95": p95 / 1e6,
            "p99": p99 / 1e6, "max": mx / 1e6, "mean": mean / 1e6}
