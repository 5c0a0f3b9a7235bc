"""Quantiles from an engine's own Prometheus histogram, as PromQL's ``histogram_quantile``.

Engines export cumulative bucket counts since they started; subtract two scrapes with
:func:`buckets_delta` to get a window, then ask :func:`engine_ttft_quantile` for e.g. the
p95 — the engine's view of TTFT, to put next to the proxy's (which adds network and the
proxy's own queueing, and is what clients see).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = Sequence[tuple[float, float]]


def engine_ttft_quantile(buckets: Buckets, q: float) -> float | None:
    """The ``q`` quantile (0 ≤ q ≤ 1) of cumulative ``(upper bound, count)`` buckets.

    Same rules as Prometheus: linear interpolation inside the bucket the rank falls in
    (from 0 for the first bucket when its bound is positive); a rank in the ``+Inf``
    bucket gives the highest finite bound; counts are made monotonic first. None when
    there is no ``+Inf`` bucket (the total is unknown) or no observations.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], got {q}")
    rows = sorted((float(le), float(c)) for le, c in buckets)
    if len(rows) < 2 or not math.isinf(rows[-1][0]):
        return None
    fixed: list[tuple[float, float]] = []
    running = 0.0
    for le, c in rows:
        running = max(running, c)
        fixed.append((le, running))
    total = fixed[-1][1]
    if total <= 0:
        return None
    rank = q * total
    for i, (le, count) in enumerate(fixed):
        if count < rank:
            continue
        if math.isinf(le):
            return fixed[-2][0]
        if i == 0:
            if le <= 0:
                return le
            lower, below = 0.0, 0.0
        else:
            lower, below = fixed[i - 1]
        in_bucket = count - below
        if in_bucket <= 0:
            return le
        return lower + (le - lower) * (rank - below) / in_bucket
    return fixed[-2][0]  # pragma: no cover - rank <= total always lands above


def buckets_delta(newer: Buckets, older: Buckets) -> tuple[tuple[float, float], ...]:
    """``newer − older`` bucket by bucket: the observations between two scrapes.

    If the engine restarted (a count went down) or the bounds differ, ``newer`` is returned
    as is — everything it holds happened since the restart.
    """
    old = {float(le): float(c) for le, c in older}
    new = [(float(le), float(c)) for le, c in newer]
    if not old or set(old) != {le for le, _ in new}:
        return tuple(new)
    out = tuple((le, c - old[le]) for le, c in new)
    if any(c < 0 for _, c in out):
        return tuple(new)
    return out
