"""The report's slowest requests: the K with the longest TTFT and the K with the longest
E2E, each named by llmtop's ``id`` and the engine's ``upstream_id``.

The report's latency figures are aggregates; "TTFT p99 4.2 s" says nothing of which
requests those were. These lists name them, so that an operator can look each one up in
the engine's logs. Memory is bounded whatever the recording's size: a heap of K rows per
list (the report streams multi-GB recordings), a row made only when a request enters one.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the CLI reads SLOWEST for --help: not numpy's import time (~60 ms)
    from llmtop.events import RequestRecord

SLOWEST: Final = 5
"""How many requests each list names."""

_Entry = tuple[float, float, int, dict[str, Any]]
"""(latency, −t_start, −arrival, row): the heap's root is the one to drop first, the
fastest kept — on a tie the later start, then the later read (a deterministic order)."""


def _row(r: RequestRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "upstream_id": r.upstream_id,
        "t_start": r.t_start,
        "user": r.user,
        "model": r.model,
        "outcome": r.outcome,
        "status": r.status,
        "stream": r.stream,
        "ttft_s": r.ttft_s,
        "e2e_s": r.e2e_s,
        "output_tokens": r.completion_tokens,
    }


class Slowest:
    """The K slowest requests by TTFT (those with a first token) and by E2E (every request:
    a non-streamed answer, an error or a timeout has an E2E)."""

    __slots__ = ("_e2e", "_n", "_ttft", "k")

    def __init__(self, k: int = SLOWEST) -> None:
        self.k = k
        self._ttft: list[_Entry] = []
        self._e2e: list[_Entry] = []
        self._n = 0

    def add(self, r: RequestRecord) -> None:
        if self.k <= 0:
            return
        self._n += 1
        row: dict[str, Any] | None = None
        for heap, v in ((self._ttft, r.ttft_s), (self._e2e, r.e2e_s)):
            if v is None or not math.isfinite(v):
                continue
            if len(heap) >= self.k and v < heap[0][0]:  # the common case: not among them
                continue
            if row is None:
                row = _row(r)
            entry = (v, -r.t_start, -self._n, row)
            if len(heap) < self.k:
                heapq.heappush(heap, entry)
            elif entry[:3] > heap[0][:3]:
                heapq.heapreplace(heap, entry)

    def as_dict(self) -> dict[str, Any]:
        """``{"k": K, "ttft": [row, …], "e2e": [row, …]}``, slowest first."""
        def ranked(heap: list[_Entry]) -> list[dict[str, Any]]:
            return [e[3] for e in sorted(heap, key=lambda e: e[:3], reverse=True)]

        return {"k": self.k, "ttft": ranked(self._ttft), "e2e": ranked(self._e2e)}
