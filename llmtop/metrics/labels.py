"""Bounded label sets: the top N users (or models) by traffic get their own series.

Every label value has a *score*: the requests it sent, decayed with a 60 s half-life, so
"top by traffic" means recent traffic. Scores are kept for at most ``8 × N`` untracked
values (the lowest are forgotten), so a flood of one-off users cannot grow memory. How
many untracked values were active recently is counted from those scores, or, once some
were forgotten, from a fixed-size HyperLogLog sketch of the last 140 s (56 KiB at most).

- A new value takes a free slot at once.
- With every slot taken, it is counted in ``other`` while its score grows.
- :meth:`LabelSlots.rebalance` (every 10 s) promotes an untracked value whose score is
  more than twice the weakest tracked value's (plus one): the weakest is demoted — its
  whole history is folded into ``other`` (totals stay exact) — and the newcomer starts a
  fresh series in the freed slot. Its traffic from before promotion stays in ``other``.

The fold is a series, not a value: a user (or model) whose name is literally ``other`` is
a value like any other, with a slot of its own. Where only the name tells rows apart, the
fold keeps the name ``other`` and it is the real value that is told apart: the snapshot's
rows carry ``tracked`` (false only for the fold), and :meth:`LabelSlots.labels` (the
Prometheus label values) adds one ``_`` to a tracked name of the form ``other``, ``other_``,
``other__``... (:func:`label_value`), so no two series share a label value.

Models: a request that names no model (none, or a blank name) is counted as the model
``unknown`` (:data:`UNNAMED_MODEL`); a model literally named ``unknown`` is then labelled
``unknown_`` (and ``unknown_`` ``unknown__``..., one ``_`` more each: :func:`model_label`)
everywhere the aggregator names it — series, snapshot rows, /metrics labels, learned rates —
so it is not merged with the requests that named none.
"""

from __future__ import annotations

import math
from collections import deque
from hashlib import blake2b
from typing import Final

import numpy as np

OTHER: Final = "other"
UNNAMED_MODEL: Final = "unknown"
"""The label of requests that name no model."""
HALF_LIFE_S: Final = 60.0
RECENT_SCORE: Final = 0.2
"""A decayed score this high: the value sent a request within about two minutes."""
RECENT_BUCKET_S: Final = 10.0
RECENT_BUCKETS: Final = 14
"""The untracked values seen are also sketched per 10 s, for the last 140 s: one request
scores 1, which decays below :data:`RECENT_SCORE` after 60 s × log2(5) ≈ 139 s."""
SKETCH_P: Final = 12
SKETCH_M: Final = 1 << SKETCH_P
"""HyperLogLog registers per bucket (4 KiB): within about 1-2% up to some ten thousand
distinct values (linear counting), 1.6% standard error beyond."""


def label_value(name: str) -> str:
    """The label value of a tracked ``name``: itself, except that the names ``other``,
    ``other_``, ``other__``... get one more ``_`` (``other`` is the fold's). One-to-one, so
    no tracked value takes the fold's label or another's."""
    if name.startswith(OTHER) and name.count("_", len(OTHER)) == len(name) - len(OTHER):
        return name + "_"
    return name


def model_label(model: str | None) -> str:
    """The label ``model`` is counted under: :data:`UNNAMED_MODEL` for none or a blank name
    (empty or whitespace only: it names no model), a name of the form ``unknown``,
    ``unknown_``... with one ``_`` more (one-to-one, so no model takes the unnamed label
    or another's), any other name as sent."""
    if not model or model.isspace():
        return UNNAMED_MODEL
    if model.startswith(UNNAMED_MODEL) and model.rstrip("_") == UNNAMED_MODEL:
        return model + "_"
    return model


class LabelSlots:
    """Series ids ``base .. base + capacity - 1`` for tracked values, ``other_id`` for the
    rest."""

    def __init__(self, capacity: int, base: int, other_id: int) -> None:
        self.capacity = capacity
        self.other_id = other_id
        self._free = list(range(base + capacity - 1, base - 1, -1))
        self.ids: dict[str, int] = {}
        """Tracked value → series id."""
        self.names: dict[int, str] = {other_id: OTHER}
        """Series id → value (``other`` included)."""
        self.scores: dict[str, float] = {}
        self.demotions = 0
        self._recent: deque[bytearray] = deque(maxlen=RECENT_BUCKETS)
        """HyperLogLog registers of the untracked values that sent a request, one bucket per
        :data:`RECENT_BUCKET_S` (newest last); none until a value is first untracked."""
        self._bucket_age = 0.0
        self._forgot = 0
        """Buckets to go until no value forgotten by :meth:`_prune` can be recent any more:
        while above zero, :meth:`untracked_recent` counts from the sketch."""

    @property
    def has_free(self) -> bool:
        """Whether a value not seen yet would get a slot of its own."""
        return bool(self._free)

    def series_for(self, name: str, weight: float = 1.0) -> int:
        """The series of ``name``, admitting it if a slot is free; adds ``weight`` to its
        score."""
        if weight:
            self.scores[name] = self.scores.get(name, 0.0) + weight
        sid = self.ids.get(name)
        if sid is not None:
            return sid
        if self._free:
            sid = self._free.pop()
            self.ids[name] = sid
            self.names[sid] = name
            return sid
        if weight:
            self._sketch(name)
        if len(self.scores) > 8 * self.capacity + len(self.ids):
            self._prune()
        return self.other_id

    def _sketch(self, name: str) -> None:
        """Add an untracked value to the current bucket's HyperLogLog registers."""
        if not self._recent:
            self._recent.append(bytearray(SKETCH_M))
        # a fixed hash (not the per-process salted hash()): the same estimate every run
        h = int.from_bytes(blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest())
        rank = 65 - SKETCH_P - (h >> SKETCH_P).bit_length()  # first 1 bit's position
        reg = self._recent[-1]
        j = h & (SKETCH_M - 1)
        if rank > reg[j]:
            reg[j] = rank

    def peek(self, name: str) -> int:
        """The series ``name`` is counted in now, without admitting or scoring it."""
        return self.ids.get(name, self.other_id)

    def _prune(self) -> None:
        untracked = sorted((s, n) for n, s in self.scores.items() if n not in self.ids)
        for _, n in untracked[: len(untracked) // 2]:
            del self.scores[n]
        self._forgot = RECENT_BUCKETS + 1

    def rebalance(self, elapsed_s: float) -> dict[int, int]:
        """Decay scores by ``elapsed_s`` and swap in heavier untracked values.

        Returns ``{demoted series id: other_id}``: the caller must fold those series into
        ``other`` before recording anything new (their ids now belong to newcomers).
        """
        if elapsed_s > 0:
            f = math.pow(0.5, elapsed_s / HALF_LIFE_S)
            self.scores = {
                n: s * f for n, s in self.scores.items() if s * f > 1e-3 or n in self.ids
            }
            self._rotate(elapsed_s)
        remap: dict[int, int] = {}
        if self._free or not self.ids:
            return remap
        untracked = sorted(
            ((s, n) for n, s in self.scores.items() if n not in self.ids),
            reverse=True,
        )
        for score, name in untracked[:4]:
            weakest = min(self.ids, key=lambda n: self.scores.get(n, 0.0))
            if score <= 2 * self.scores.get(weakest, 0.0) + 1:
                break
            sid = self.ids.pop(weakest)
            remap[sid] = self.other_id
            self.ids[name] = sid
            self.names[sid] = name
            self.demotions += 1
        return remap

    def _rotate(self, elapsed_s: float) -> None:
        """Start a new sketch bucket per :data:`RECENT_BUCKET_S` elapsed (the oldest go)."""
        if not self._recent:
            return
        self._bucket_age += elapsed_s
        n = int(self._bucket_age // RECENT_BUCKET_S)
        self._bucket_age -= n * RECENT_BUCKET_S
        for _ in range(min(n, RECENT_BUCKETS)):
            self._recent.append(bytearray(SKETCH_M))
        self._forgot = max(0, self._forgot - n)

    def untracked_recent(self, min_score: float = RECENT_SCORE) -> int:
        """How many values counted in ``other`` were active recently (a decayed score of
        at least ``min_score``: one request within about two minutes). Approximate: scores
        decay at each rebalance. Exact while every untracked value is remembered; once
        more than ``8 × capacity`` were and some were forgotten (the memory bound), the
        count of distinct values of the last 140 s from the sketch, if higher (1-2%
        error; it cannot tell values since promoted)."""
        ids = self.ids
        exact = sum(1 for n, s in self.scores.items() if s >= min_score and n not in ids)
        if self._forgot <= 0 or not self._recent:
            return exact
        return max(exact, round(self._estimate()))

    def _estimate(self) -> float:
        """HyperLogLog estimate of the distinct values in the sketch's buckets (their
        union), with linear counting for small counts."""
        buckets = np.frombuffer(b"".join(self._recent), dtype=np.uint8)
        reg = buckets.reshape(len(self._recent), SKETCH_M).max(axis=0)
        m = float(SKETCH_M)
        zeros = int(np.count_nonzero(reg == 0))
        harmonic = float(np.sum(np.ldexp(1.0, -reg.astype(np.int32))))
        raw = 0.7213 / (1 + 1.079 / m) * m * m / harmonic
        if raw <= 2.5 * m and zeros:
            return m * math.log(m / zeros)
        return raw

    def tracked(self) -> dict[int, str]:
        """Series id → name of every series in use, ``other`` included."""
        return {sid: n for n, sid in self.ids.items()} | {self.other_id: OTHER}

    def labels(self) -> dict[int, str]:
        """Series id → label value of every series in use: as :meth:`tracked`, but a
        tracked value named like the fold told apart from it (:func:`label_value`)."""
        return {sid: label_value(n) for n, sid in self.ids.items()} | {self.other_id: OTHER}
