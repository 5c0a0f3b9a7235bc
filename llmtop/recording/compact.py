"""Request records packed for the replay's read-ahead.

A recording writes each request when it *ended*; the replay plays it from its *start*, so
it reads ``lookahead_s`` (600 s) of the file ahead of its clock and holds those records until
they end. As tuples of Python floats and ints a record's chunk lists cost about 40 bytes a
chunk (a pointer and a float object per offset, a pointer per token count); at 15 requests a
second of 2,000-chunk answers that is most of a gigabyte. :class:`HeldRecord` keeps them as
``array('d')`` (8 bytes an offset: the same IEEE doubles, so they read back exactly) and
the token counts in the narrowest integer array that holds them — or, the usual case of one
token a chunk, just their number. :meth:`HeldRecord.unpack` gives back a record equal to the
one packed, field for field.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from llmtop.events import RequestRecord

PACK_MIN_CHUNKS: Final = 16
"""Records with fewer chunks are held as they are: a packed record's own objects (a bare
copy and an array) cost about what a few chunks do."""

_CODES: Final = (("B", 0xFF), ("H", 0xFFFF), ("I", 0xFFFF_FFFF), ("q", (1 << 63) - 1))
"""Unsigned integer arrays by width (``I`` is 4 bytes on every platform CPython runs on;
``q`` is the widest, signed: counts never exceed ``validate.MAX_COUNT`` = 2**40)."""


def _int_array(values: Sequence[int]) -> array[int] | None:
    """``values`` in the narrowest integer array that holds them exactly; None when one is
    not a plain ``int`` (a ``bool`` would read back as an int) or does not fit."""
    if set(map(type, values)) != {int}:
        return None
    lo, hi = min(values), max(values)
    if lo < 0:
        return None
    for code, top in _CODES:
        if hi <= top:
            return array(code, values)
    return None


@dataclass(slots=True, eq=False)
class HeldRecord:
    """One request record in the read-ahead, its chunk lists packed.

    ``bare`` is the record with empty chunk lists (every other field is the original's own
    object); ``offsets`` its ``chunk_offsets_s``; ``tokens`` its ``chunk_tokens``, or — when
    each of them is ``1`` — their number.
    """

    bare: RequestRecord
    offsets: array[float]
    tokens: array[int] | int

    def nbytes(self) -> int:
        """Bytes the packed chunk lists take (their buffers, not the array objects)."""
        n = self.offsets.buffer_info()[1] * self.offsets.itemsize
        if isinstance(self.tokens, array):
            n += self.tokens.buffer_info()[1] * self.tokens.itemsize
        return n

    def unpack(self) -> RequestRecord:
        """The record as it was read: equal to the one packed, field for field."""
        toks = self.tokens
        chunk_tokens = (1,) * toks if isinstance(toks, int) else tuple(toks.tolist())
        return replace(self.bare, chunk_offsets_s=tuple(self.offsets.tolist()),
                       chunk_tokens=chunk_tokens)

    def cum_tokens(self) -> array[int] | list[int] | None:
        """Tokens up to and including each chunk; None when every chunk carried one (then
        the tokens so far are the chunks so far)."""
        if isinstance(self.tokens, int):
            return None
        try:
            return array("q", itertools.accumulate(self.tokens))
        except OverflowError:  # beyond 2**63: cannot happen with counts of at most 2**40
            return list(itertools.accumulate(self.tokens))


def pack(rec: RequestRecord) -> RequestRecord | HeldRecord:
    """``rec`` packed for holding, or ``rec`` itself when packing would not save memory (few
    chunks) or could not give it back exactly (a token count that is not a plain int: JSON
    ``true`` passes the reader's checks as a count of 1 but would read back as ``1``).
    ``rec.chunk_offsets_s`` must hold floats, as the reader's records do."""
    offs, toks = rec.chunk_offsets_s, rec.chunk_tokens
    if len(offs) + len(toks) < PACK_MIN_CHUNKS:
        return rec
    packed_toks: array[int] | int
    if not toks or (toks.count(1) == len(toks) and set(map(type, toks)) == {int}):
        packed_toks = len(toks)
    else:
        arr = _int_array(toks)
        if arr is None:
            return rec
        packed_toks = arr
    # offsets are floats (the reader makes every one a float: validate._numbers), so the
    # array holds the very same doubles
    return HeldRecord(replace(rec, chunk_offsets_s=(), chunk_tokens=()), array("d", offs),
                      packed_toks)
