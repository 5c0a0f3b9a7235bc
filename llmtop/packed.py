"""Request records packed to be held: the replay's read-ahead, the aggregator's recent requests.

A recording writes each request when it *ended*; the replay plays it from its *start*, so
it reads ``lookahead_s`` (600 s) of the file ahead of its clock and holds those records until
they end. As tuples of Python floats and ints a record's chunk lists cost about 40 bytes a
chunk (a pointer and a float object per offset, a pointer per token count); at 15 requests a
second of 2,000-chunk answers that is most of a gigabyte. :class:`HeldRecord` keeps the
offsets as packed doubles (8 bytes each: the same IEEE values, so they read back exactly)
and the token counts as the narrowest unsigned integers that hold them — or, the usual case
of one token a chunk, just their number. :meth:`HeldRecord.unpack` gives back a record equal
to the one packed, field for field, element types included.
"""

from __future__ import annotations

import itertools
import struct
from array import array
from dataclasses import dataclass, replace
from typing import Final

from llmtop.events import RequestRecord

PACK_MIN_CHUNKS: Final = 16
"""Records with fewer chunks (offsets and counts together) are held as they are: a packed
record's own objects (a bare copy, two bytes objects) cost about what a few chunks do."""

_CODES: Final = ("B", "H", "I", "Q")
"""Unsigned integer widths tried in turn (1, 2, 4, 8 bytes: standard sizes with ``=``)."""


def _pack_counts(values: tuple[int, ...]) -> tuple[str, bytes] | None:
    """``values`` as the narrowest unsigned integers that hold them: (struct code, bytes);
    None when one is not a plain ``int`` (a ``bool`` would read back as an int) or does not
    fit in 8 bytes."""
    if set(map(type, values)) != {int}:
        return None
    for code in _CODES:
        try:
            return code, struct.pack(f"={len(values)}{code}", *values)
        except struct.error:  # a value outside this width (or negative): try the next
            continue
    return None


@dataclass(slots=True, eq=False)
class HeldRecord:
    """One request record in the read-ahead, its chunk lists packed.

    ``bare`` is the record with empty chunk lists (every other field is the original's own
    object); ``offsets`` its ``chunk_offsets_s`` as native doubles; ``tokens`` its
    ``chunk_tokens`` as unsigned integers of struct code ``code`` — or, when each of them is
    ``1``, their number.
    """

    bare: RequestRecord
    offsets: bytes
    tokens: bytes | int
    code: str = "B"

    def nbytes(self) -> int:
        """Bytes of packed chunk data held (not counting the objects' own headers)."""
        return len(self.offsets) + (0 if isinstance(self.tokens, int) else len(self.tokens))

    def offsets_view(self) -> memoryview[float]:
        """The chunk offsets as a sequence of floats, without copying them."""
        return memoryview(self.offsets).cast("d")

    def _counts(self) -> tuple[int, ...]:
        toks = self.tokens
        if isinstance(toks, int):
            return (1,) * toks
        n = len(toks) // struct.calcsize(f"={self.code}")
        return struct.unpack(f"={n}{self.code}", toks)

    def unpack(self) -> RequestRecord:
        """The record as it was read: equal to the one packed, field for field."""
        offs: tuple[float, ...] = struct.unpack(f"{len(self.offsets) // 8}d", self.offsets)
        return replace(self.bare, chunk_offsets_s=offs, chunk_tokens=self._counts())

    def cum_tokens(self) -> array[int] | list[int] | None:
        """Tokens up to and including each chunk; None when every chunk carried one (then
        the tokens so far are the chunks so far)."""
        if isinstance(self.tokens, int):
            return None
        try:
            return array("q", itertools.accumulate(self._counts()))
        except OverflowError:  # a sum beyond 2**63 (counts are at most 2**40 each)
            return list(itertools.accumulate(self._counts()))


def pack(rec: RequestRecord) -> RequestRecord | HeldRecord:
    """``rec`` packed for holding, or ``rec`` itself when packing would not save memory (few
    chunks) or could not give it back exactly (a token count that is not a plain int: JSON
    ``true`` passes the reader's checks as a count of 1 but would read back as ``1``).
    ``rec.chunk_offsets_s`` must hold floats, as the reader's records do
    (``validate._numbers`` makes each one a float): an int would read back as a float."""
    offs, toks = rec.chunk_offsets_s, rec.chunk_tokens
    if len(offs) + len(toks) < PACK_MIN_CHUNKS:
        return rec
    tokens: bytes | int
    code = "B"
    if not toks or (toks.count(1) == len(toks) and set(map(type, toks)) == {int}):
        tokens = len(toks)
    else:
        packed = _pack_counts(toks)
        if packed is None:
            return rec
        code, tokens = packed
    return HeldRecord(replace(rec, chunk_offsets_s=(), chunk_tokens=()),
                      struct.pack(f"{len(offs)}d", *offs), tokens, code)
