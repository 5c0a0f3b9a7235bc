"""A finished stream's per-chunk figures — chunk times in seconds, token counts scaled to
the engine's usage — built in bulk for long streams.

The proxy builds a request's record on the loop that forwards every stream (and the bench
client on the loop that measures them): while it does, every other stream waits. Element by
element in Python, a 64k-event answer took 20 ms (usage equal to the events counted) to
60 ms (rescaled: the usual vLLM case, the stop token is in the usage but had no delta; the
largest-remainder step sorted every index) — QA saw 21–61 ms gaps in streams at 10 ms a
token when such answers ended. From :data:`BULK` chunks on, the work is done on numpy
arrays (the packed ``array('q')`` an open stream holds is read without a copy) and only
the final tuples are built in Python; shorter streams stay in plain Python, where numpy's
cost per call is more than the whole job. Both give the same values and element types
(Python ``float`` and ``int`` in tuples): ``(o - t0) / 1e9`` is an int64 subtraction, the
exact conversion of the difference to a double (|difference| < 2**53 ns, 104 days) and an
IEEE division, in Python and numpy alike; the largest-remainder share is exact integer
arithmetic with the same tie rule (tests/proxy/test_relay_record_cost.py).
"""

from __future__ import annotations

from array import array
from typing import Final, TypeAlias

import numpy as np
from numpy.typing import NDArray

BULK: Final = 256
"""From this many chunks on, the figures are computed on numpy arrays."""

_LIMIT: Final = 2**62
"""Products of a weight and a total below this fit int64 with room (else plain Python)."""

I64: TypeAlias = NDArray[np.int64]
Part: TypeAlias = "array[int] | list[int] | None"
"""Part of a stream's chunk times or counts: packed (``array('q')``, read in place by
numpy), a plain list, or None (nothing)."""


def _parts(parts: tuple[Part, ...]) -> list[array[int] | list[int]]:
    return [p for p in parts if p]


def _int64(parts: list[array[int] | list[int]]) -> I64:
    """The parts, in order, as one int64 array (a packed part alone is viewed, not copied:
    its ``base`` is then not None)."""
    arrays = [np.frombuffer(p, dtype=np.int64) if isinstance(p, array) and p.typecode == "q"
              else np.array(p, dtype=np.int64) for p in parts]
    if len(arrays) == 1:
        return arrays[0]
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(arrays)


def seconds_since(t0: int, *parts: Part) -> tuple[float, ...]:
    """``(o - t0) / 1e9`` for each ``perf_counter_ns`` ``o`` of the parts, in order."""
    got = _parts(parts)
    if sum(map(len, got)) < BULK:
        src = got[0] if len(got) == 1 else [o for p in got for o in p]
        return tuple([(o - t0) / 1e9 for o in src])
    ns = _int64(got)
    # one int64 array of differences, divided in place into the float64 view of its memory
    # (elementwise, each element read before it is written): no other 8-byte-a-chunk
    # temporary — each one is a fresh mmap at 64k chunks, page-faulted on first touch
    diff = np.subtract(ns, t0, out=ns if ns.base is None else None)  # not packed memory
    secs = diff.view(np.float64)
    np.true_divide(diff, 1e9, out=secs)
    return tuple(secs.tolist())


class ChunkCounts:
    """The token counts of a stream's content chunks (the parts, in order), as a record
    holds them: :meth:`scaled` gives the tuple, scaled to a total when it differs."""

    __slots__ = ("_n", "_parts", "counted")

    def __init__(self, *parts: Part) -> None:
        self._parts = _parts(parts)
        self._n = sum(map(len, self._parts))
        self.counted: int = sum(
            int(np.frombuffer(p, dtype=np.int64).sum())
            if isinstance(p, array) and p.typecode == "q" and len(p) >= BULK else sum(p)
            for p in self._parts)
        """Tokens the parser counted, all chunks together."""

    def __len__(self) -> int:
        return self._n

    def scaled(self, total: int | None = None) -> tuple[int, ...]:
        """Each chunk's tokens: as counted (``total`` None or equal to :attr:`counted`),
        else as :func:`scale_tokens` shares ``total`` out."""
        parts = self._parts
        if total is None or total == self.counted:
            if len(parts) == 1:
                return tuple(parts[0])
            whole = array("q")
            for p in parts:
                whole.extend(p)
            return tuple(whole)
        if self._n >= BULK:
            out = _scale_bulk(_int64(parts), total)
            if out is not None:
                return tuple(out.tolist())
        return tuple(_scale_py([k for p in parts for k in p], total))


def scale_tokens(counts: list[int], total: int) -> list[int]:
    """Per-chunk token counts scaled so they sum to ``total`` (the engine's usage).

    The first content event is the first token — what prefill produces, one token, even
    from engines that pack several into later chunks — so the first chunk keeps one token
    for it and the other ``total - 1`` are shared in proportion to the events counted
    (largest remainder; ties go to the earlier chunk). Spreading all of ``total`` evenly
    gave the first chunk a share of the decode tokens, which then counted for no ITL sample:
    mean ITL came out 12–27% above TPOT. Chunks that counted nothing share evenly when all
    did."""
    if len(counts) >= BULK and sum(counts) != max(total, 0):
        out = _scale_bulk(np.array(counts, dtype=np.int64), total)
        if out is not None:
            return out.tolist()  # type: ignore[no-any-return]
    return _scale_py(counts, total)


def _scale_py(counts: list[int], total: int) -> list[int]:
    """:func:`scale_tokens` in plain Python (any length, any values)."""
    n = len(counts)
    if n == 0:
        return []
    total = max(total, 0)
    have = sum(counts)
    if have == total:
        return list(counts)
    if have == 0:
        return _share_py([1] * n, total)
    if total == 0:
        return [0] * n
    first = 1 if counts[0] > 0 else 0
    weights = [counts[0] - first, *counts[1:]]
    if sum(weights) == 0:
        weights = [1] * n
    out = _share_py(weights, total - first)
    out[0] += first
    return out


def _share_py(weights: list[int], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` (positive sum): largest remainder,
    ties to the earlier index."""
    n, wsum = len(weights), sum(weights)
    base = [w * total // wsum for w in weights]
    left = total - sum(base)
    if left:
        order = sorted(range(n), key=lambda i: (-(weights[i] * total % wsum), i))
        for i in order[:left]:
            base[i] += 1
    return base


def _scale_bulk(c: I64, total: int) -> I64 | None:
    """:func:`scale_tokens` on an int64 array (left as it is: it may be the memory of the
    packed counts); None where int64 might not hold the exact products (negative counts,
    huge totals): the caller then works in plain Python."""
    n = len(c)
    if n == 0:
        return c
    total = max(total, 0)
    lo, hi = int(c.min()), int(c.max())
    if lo < 0 or max(hi, 1) * max(total, 1) >= _LIMIT or n * max(hi, 1) >= _LIMIT:
        return None
    have = int(c.sum())
    if have == total:
        return c
    if have == 0:
        return _share_bulk(np.ones(n, dtype=np.int64), total)
    if total == 0:
        return np.zeros(n, dtype=np.int64)
    first = 1 if c[0] > 0 else 0
    if have - first == 0:
        weights = np.ones(n, dtype=np.int64)
    else:
        weights = c.copy()
        weights[0] -= first
    out = _share_bulk(weights, total - first)
    out[0] += first
    return out


def _share_bulk(weights: I64, total: int) -> I64:
    """:func:`_share_py` on an int64 array (``weights`` is overwritten and returned) without
    sorting: only the ``left`` largest remainders take one more, found by one partial
    partition — every index whose remainder is above the ``left``-th largest value, then
    the earliest of those equal to it (ties to the earlier index)."""
    wsum = int(weights.sum())
    base = np.multiply(weights, total, out=weights)
    rem = np.remainder(base, wsum)
    np.floor_divide(base, wsum, out=base)
    left = total - int(base.sum())
    if left:
        k = len(base) - left
        kth = np.partition(rem, k)[k]
        above = rem > kth
        base += above
        need = left - int(np.count_nonzero(above))
        if need:
            base[np.flatnonzero(rem == kth)[:need]] += 1
    return base
