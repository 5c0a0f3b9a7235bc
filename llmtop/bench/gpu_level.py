"""GPU readings over a load level: sampled while the level runs and summed up over its
measured part (after the warm-up, before the drain), per GPU.

A single reading taken when the level had ended fell in its drain, when the load was
already going: against the simulator, concurrency 64 read 37 % DRAM bandwidth and 16 read
66 %. Now each GPU's figures are the mean of the readings whose time ``t`` falls inside
the measured part (memory used: the most), with ``samples`` (how many) and
``dram_bw_util_max``; a level too short for any reading inside it keeps the one taken at
its end (``samples`` 1).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

SAMPLE_S = 0.5
"""How often readings are asked for during a level (the GPU sampler's own interval)."""

_KEEP = frozenset({"index", "t", "name", "simulated", "mem_total_bytes"})
"""Fields taken from the latest reading as they are (not averaged)."""


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def over_level(readings: Sequence[dict[str, Any]], started: float,
               ended: float) -> list[dict[str, Any]]:
    """Per GPU (by ``index``, in order), the readings with ``started <= t <= ended``
    summed up: the latest one's identity fields, each other numeric field's mean over
    the readings that have it as a number (else the latest's value), ``mem_used_bytes``
    the most,
    ``dram_bw_util_max`` and ``samples``. [] when no reading falls inside."""
    by_gpu: dict[object, list[dict[str, Any]]] = {}
    for g in readings:
        t = _number(g.get("t"))
        if t is not None and started <= t <= ended:
            by_gpu.setdefault(g.get("index"), []).append(g)
    out: list[dict[str, Any]] = []
    for _, rows in sorted(by_gpu.items(), key=lambda kv: (
            not isinstance(kv[0], int), kv[0] if isinstance(kv[0], int) else 0)):
        rows.sort(key=lambda g: float(g["t"]))
        last = rows[-1]
        level: dict[str, Any] = {k: last.get(k) for k in last if k in _KEEP}
        for key in {k for g in rows for k in g} - _KEEP:
            values = [x for x in (_number(g.get(key)) for g in rows) if x is not None]
            if key == "mem_used_bytes":
                level[key] = int(max(values)) if values else None
            elif values:
                level[key] = sum(values) / len(values)
            elif key in last:  # no number in any reading: the latest's, as it is
                level[key] = last[key]
        bw = [x for x in (_number(g.get("dram_bw_util")) for g in rows) if x is not None]
        level["dram_bw_util_max"] = max(bw) if bw else None
        level["samples"] = len(rows)
        out.append(level)
    return out


async def collect(read: Callable[[], Awaitable[list[dict[str, Any]]]],
                  into: list[dict[str, Any]], every_s: float = SAMPLE_S) -> None:
    """Append each new reading ``read()`` gives (new: another ``(index, t)``) to ``into``
    every ``every_s`` until cancelled (``read`` says a failure as [], not by raising)."""
    seen: set[tuple[object, object]] = set()
    while True:
        for g in await read():
            key = (g.get("index"), g.get("t"))
            if key not in seen:
                seen.add(key)
                into.append(g)
        await asyncio.sleep(every_s)
