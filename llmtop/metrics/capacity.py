"""Capacity at SLO, estimated live from production traffic.

Every finished request is binned by ``concurrency_at_start`` (how many requests the proxy
had in flight when it started, itself included). A bin *qualifies* once it holds at least
:data:`MIN_REQUESTS_PER_BIN` judged requests; a qualified bin *holds* the SLOs when its
share of judged requests meeting every SLO is at least the target. A request is *judged*
unless its client cancelled it while it was still within every objective (see
:mod:`llmtop.metrics.slo`); bins from an llmtop without the ``judged`` count use
``requests``.

**Rule.** Walk the qualified bins from the lowest concurrency up; the capacity is the
highest concurrency reached before the first qualified bin that misses the target
("the largest concurrency that still holds the target at every lower observed level" —
so a lucky high bin past the knee cannot inflate it). Bins with too little data neither
count nor stop the walk.

- ``max_concurrency_at_slo`` is ``None`` until some bin qualifies; ``0`` when the lowest
  qualified bin already misses the target and no lower concurrency was seen at all (the
  SLOs are not met at any observed load). When lower levels were seen but none of them
  has enough requests yet (a load ramp's first pass), it stays ``None`` with
  ``first_failing_concurrency`` set: the capacity is below that level, not zero.
- ``goodput_tps_at_slo`` at concurrency c, by Little's law: with c requests always in
  flight, throughput = c × (work per request ÷ time per request), so
  ``c × Σ output tokens of SLO-meeting requests ÷ Σ E2E of all requests`` in that bin
  (``goodput_rps_at_slo`` likewise with request counts).

The estimate uses every request since the aggregator started (the bins need many
requests per level); bins are carried in the snapshot so proxies merge exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MIN_REQUESTS_PER_BIN: Final = 20
MAX_CONCURRENCY_BIN: Final = 65_536
"""Concurrency values above this share the last bin."""

_REQ, _MET, _GOOD_TOK, _E2E, _JUDGED = range(5)
_COLS: Final = 5


def judged_of(b: Mapping[str, Any]) -> int:
    """A bin's judged requests (its ``requests`` when it has no ``judged`` count)."""
    return int(b.get("judged", b.get("requests", 0)))


class CapacityBins:
    """Per-concurrency sums: requests, met, good output tokens, E2E seconds, judged."""

    def __init__(self) -> None:
        self.data = np.zeros((64, _COLS), dtype=np.float64)

    def add(
        self,
        concurrency: npt.NDArray[np.int64],
        met: npt.NDArray[np.bool_],
        good_tokens: npt.NDArray[np.float64],
        e2e_s: npt.NDArray[np.float64],
        judged: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Add one batch; ``judged`` defaults to every request."""
        if len(concurrency) == 0:
            return
        c = np.clip(concurrency, 0, MAX_CONCURRENCY_BIN)
        top = int(c.max())
        if top >= len(self.data):
            grown = np.zeros((max(top + 1, 2 * len(self.data)), _COLS))
            grown[: len(self.data)] = self.data
            self.data = grown
        ones = np.ones(len(c))
        vals = np.stack([ones, met.astype(np.float64), good_tokens, e2e_s,
                         ones if judged is None else judged.astype(np.float64)], axis=1)
        np.add.at(self.data, c, vals)

    def bins(self) -> list[dict[str, Any]]:
        """Non-empty bins, ascending: ``{"concurrency", "requests", "met", "good_tokens",
        "e2e_sum_s", "judged"}``. (Built column-wise: a proxy that has seen a thousand concurrency
        levels has a thousand bins, and every snapshot carries them.)"""
        rows = np.flatnonzero(self.data[:, _REQ] > 0)
        d = self.data[rows]
        req = d[:, _REQ].astype(np.int64).tolist()
        met = d[:, _MET].astype(np.int64).tolist()
        good = d[:, _GOOD_TOK].astype(np.int64).tolist()  # sums of token counts: integers
        e2e = d[:, _E2E].tolist()
        judged = d[:, _JUDGED].astype(np.int64).tolist()
        return [
            {"concurrency": c, "requests": n, "met": m, "good_tokens": g, "e2e_sum_s": e,
             "judged": j}
            for c, n, m, g, e, j in zip(rows.tolist(), req, met, good, e2e, judged,
                                        strict=True)
        ]


    def estimate(self, target: float, min_requests: int = MIN_REQUESTS_PER_BIN,
                 *, with_bins: bool = True) -> dict[str, Any]:
        """What :func:`estimate` gives for :meth:`bins`, computed on the arrays (a live
        proxy's snapshot; without ``with_bins`` no per-bin dicts are built at all)."""
        if with_bins:
            return estimate(self.bins(), target, min_requests)
        rows = np.flatnonzero(self.data[:, _JUDGED] >= max(min_requests, 1))
        d = self.data[rows]
        holds = d[:, _MET] / d[:, _JUDGED] >= target
        failing = np.flatnonzero(~holds)
        first = int(failing[0]) if len(failing) else len(rows)
        out: dict[str, Any] = {
            "max_concurrency_at_slo": None,
            "goodput_tps_at_slo": None,
            "goodput_rps_at_slo": None,
            "attainment_at_slo": None,
            "first_failing_concurrency": int(rows[first]) if first < len(rows) else None,
            "target": target,
            "min_requests_per_bin": min_requests,
        }
        cap = None if not len(rows) else 0 if first == 0 else int(rows[first - 1])
        if cap == 0 and self.data[:int(rows[0]), _JUDGED].any():
            cap = None  # lower levels seen, none with enough requests yet
        out["max_concurrency_at_slo"] = cap
        if cap == 0:  # as estimate(): no load level holds the target
            out["goodput_tps_at_slo"] = out["goodput_rps_at_slo"] = 0.0
        elif cap is not None:
            _, met, good, e2e, judged = (float(x) for x in d[first - 1])
            if e2e > 0:
                out["goodput_tps_at_slo"] = cap * good / e2e
                out["goodput_rps_at_slo"] = cap * int(met) / e2e
            out["attainment_at_slo"] = int(met) / int(judged)
        return out


def merge_bins(bin_lists: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Sum bins from several sources by concurrency."""
    acc: dict[int, dict[str, Any]] = {}
    for bins in bin_lists:
        for b in bins:
            c = int(b["concurrency"])
            a = acc.setdefault(c, {"concurrency": c, "requests": 0, "met": 0,
                                   "good_tokens": 0.0, "e2e_sum_s": 0.0, "judged": 0})
            a["requests"] += int(b.get("requests", 0))
            a["judged"] += judged_of(b)
            a["met"] += int(b.get("met", 0))
            a["good_tokens"] += float(b.get("good_tokens", 0.0))
            a["e2e_sum_s"] += float(b.get("e2e_sum_s", 0.0))
    return [acc[c] for c in sorted(acc)]


def estimate(
    bins: Sequence[Mapping[str, Any]],
    target: float,
    min_requests: int = MIN_REQUESTS_PER_BIN,
) -> dict[str, Any]:
    """The capacity section of a snapshot from ``bins`` (see the module rule). The
    section's ``bins`` is ``bins`` itself, in ascending order (sorted here when it is not):
    pass a list the caller does not keep."""
    cap: int | None = None
    at: Mapping[str, Any] | None = None
    first_fail: int | None = None
    conc = [int(b["concurrency"]) for b in bins]
    if conc != sorted(conc):
        bins = sorted(bins, key=lambda b: int(b["concurrency"]))
    for b in bins:
        n = judged_of(b)
        if n < max(min_requests, 1):
            continue
        if int(b["met"]) / n >= target:
            cap, at = int(b["concurrency"]), b
        else:
            first_fail = int(b["concurrency"])
            if cap is None and not any(  # as the module rule: 0 only with nothing below
                    judged_of(x) for x in bins if int(x["concurrency"]) < first_fail):
                cap = 0
            break
    out: dict[str, Any] = {
        "max_concurrency_at_slo": cap,
        "goodput_tps_at_slo": None,
        "goodput_rps_at_slo": None,
        "attainment_at_slo": None,
        "first_failing_concurrency": first_fail,
        "target": target,
        "min_requests_per_bin": min_requests,
        "bins": bins if isinstance(bins, list) else list(bins),
    }
    if cap == 0:
        out["goodput_tps_at_slo"] = 0.0
        out["goodput_rps_at_slo"] = 0.0
    elif at is not None:
        e2e = float(at["e2e_sum_s"])
        c = int(at["concurrency"])
        if e2e > 0:
            out["goodput_tps_at_slo"] = c * float(at["good_tokens"]) / e2e
            out["goodput_rps_at_slo"] = c * int(at["met"]) / e2e
        out["attainment_at_slo"] = int(at["met"]) / judged_of(at)
    return out
