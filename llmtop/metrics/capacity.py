"""Capacity at SLO, estimated live from production traffic.

Every finished request is binned by ``concurrency_at_start`` (how many requests the proxy
had in flight when it started, itself included). A request is *judged* unless its client
cancelled it while it was still within every objective (see :mod:`llmtop.metrics.slo`);
bins from an llmtop without the ``judged`` count use ``requests``.

**Levels.** A bin with at least :data:`MIN_REQUESTS_PER_BIN` judged requests is a level
of its own. Bins with fewer are pooled with their neighbours above, in order, until the
pool has that many (a load ramp visits each concurrency briefly: its first pass gives a
few requests per level, and pooled they say something at once); a pool left short when
the next bin stands on its own, or at the top, is set aside. A level *holds* the SLOs
when its share of judged requests meeting every SLO is at least the target.

**Rule.** Walk the levels from the lowest concurrency up; the capacity is the highest
concurrency of the last level that holds before the first one that misses the target
("the largest concurrency that still holds the target at every lower observed level" —
so a lucky high bin past the knee cannot inflate it). Pools set aside neither count nor
stop the walk; ``first_failing_concurrency`` is the lowest concurrency of the first
level that misses.

- ``max_concurrency_at_slo`` is ``None`` until some level forms; ``0`` when the lowest
  level already misses the target and no lower concurrency was seen at all (the SLOs are
  not met at any observed load). When lower concurrencies were seen but too few to form a
  level, it stays ``None`` with ``first_failing_concurrency`` set: the capacity is below
  that, not zero.
- ``goodput_tps_at_slo`` at the capacity's level, by Little's law: with c requests always
  in flight, throughput = c × (work per request ÷ time per request), so
  ``c × Σ output tokens of SLO-meeting requests ÷ Σ E2E of all requests`` in that level,
  c being its concurrency (its requests' mean for a pool); ``goodput_rps_at_slo``
  likewise with request counts.

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
    return int(b.get("judged", b["requests"]))


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
        rows = np.flatnonzero(self.data[:, _REQ] > 0)
        d = self.data[rows]
        return _estimate(rows.tolist(), d[:, _REQ].tolist(), d[:, _JUDGED].tolist(),
                         d[:, _MET].tolist(), d[:, _GOOD_TOK].tolist(), d[:, _E2E].tolist(),
                         target, min_requests)


def merge_bins(bin_lists: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Sum bins from several sources by concurrency."""
    acc: dict[int, dict[str, Any]] = {}
    for bins in bin_lists:
        for b in bins:
            c = int(b["concurrency"])
            a = acc.setdefault(c, {"concurrency": c, "requests": 0, "met": 0,
                                   "good_tokens": 0.0, "e2e_sum_s": 0.0, "judged": 0})
            a["requests"] += int(b.get("requests", 0))
            a["judged"] += int(b.get("judged", b.get("requests", 0)))
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
    conc = [int(b["concurrency"]) for b in bins]
    if conc != sorted(conc):
        bins = sorted(bins, key=lambda b: int(b["concurrency"]))
        conc = [int(b["concurrency"]) for b in bins]
    out = _estimate(conc, [float(b["requests"]) for b in bins],
                    [float(judged_of(b)) for b in bins], [float(b["met"]) for b in bins],
                    [float(b["good_tokens"]) for b in bins],
                    [float(b["e2e_sum_s"]) for b in bins], target, min_requests)
    out["bins"] = bins if isinstance(bins, list) else list(bins)
    return out


def _estimate(conc: list[int], req: list[float], judged: list[float], met: list[float],
              good: list[float], e2e: list[float], target: float,
              min_requests: int) -> dict[str, Any]:
    """The module rule over bins given column-wise, ascending by concurrency."""
    need = max(min_requests, 1)
    levels: list[tuple[int, int, float, float, float, float, float, float]] = []
    """(lowest, highest concurrency, requests, Σ concurrency × requests, judged, met,
    good tokens, E2E sum)"""
    pool: list[float] | None = None  # the same sums, for bins still short
    pool_lo = 0
    seen_below: list[bool] = []  # judged requests below each level's lowest concurrency
    judged_so_far = 0.0
    for c, n, j, m, g, e in zip(conc, req, judged, met, good, e2e, strict=True):
        if j >= need:  # a level of its own; a short pool below it is set aside
            pool = None
            levels.append((c, c, n, c * n, j, m, g, e))
            seen_below.append(judged_so_far > 0)
        else:
            if pool is None:
                pool, pool_lo = [0.0] * 6, c
                pool_seen = judged_so_far > 0
            for k, v in enumerate((n, c * n, j, m, g, e)):
                pool[k] += v
            if pool[2] >= need:
                levels.append((pool_lo, c, pool[0], pool[1], pool[2], pool[3], pool[4], pool[5]))
                seen_below.append(pool_seen)
                pool = None
        judged_so_far += j
    cap: int | None = None
    at: tuple[int, int, float, float, float, float, float, float] | None = None
    first_fail: int | None = None
    for lvl, below in zip(levels, seen_below, strict=True):
        if lvl[5] / lvl[4] >= target:
            cap, at = lvl[1], lvl
        else:
            first_fail = lvl[0]
            if cap is None and not below:  # 0 only with nothing seen below
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
    }
    if cap == 0:
        out["goodput_tps_at_slo"] = 0.0
        out["goodput_rps_at_slo"] = 0.0
    elif at is not None:
        _, _, n, cn, j, m, g, e = at
        c_mean = cn / n if n else float(at[1])
        if e > 0:
            out["goodput_tps_at_slo"] = c_mean * g / e
            out["goodput_rps_at_slo"] = c_mean * int(m) / e
        out["attainment_at_slo"] = int(m) / j
    return out
