"""GPM (GPU Performance Monitoring) sample chains, driven through an injected ``pynvml``.

GPM metrics are computed between two samples. A :class:`GpmChain` owns two sample
buffers for one target — the whole GPU, or one MIG GPU instance — and alternates them:
each window's later sample becomes the next window's first, so one new sample per reading
is enough. Windows shorter than the minimum (100 ms by default, NVIDIA's advice) are not
taken; the last window's values stand until a long enough one has passed.

This module calls the ``pynvml`` module it is given and lets its errors through; the
backend (:mod:`llmtop.gpu.nvml`) decides what an error means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class GpmValues:
    """GPM metrics over one window; ``None`` where unsupported or not yet two samples."""

    dram_bw_util: float | None = None
    """``NVML_GPM_METRIC_DRAM_BW_UTIL``: DRAM bandwidth used, % of the theoretical peak."""
    sm_activity: float | None = None
    """``NVML_GPM_METRIC_SM_UTIL``: % of SMs busy (DCGM's "SM active")."""


PERCENT_SLACK = 1.0
"""How far past 0–100 a percentage may read and still be one (clamped): two samples'
timing can put a saturated window a hair over 100 %."""


def as_percent(x: Any) -> tuple[float | None, bool]:
    """``x`` as a percentage and whether it was one: (value, True) within 0–100, clamped
    within :data:`PERCENT_SLACK` of it; (None, True) when missing or not finite (n/a);
    (None, False) when further out — not a percentage (a GPM window over counters that
    wrapped or went backwards, NVML's 0xFFFFFFFF "not available" marker)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None, True
    if not math.isfinite(v):
        return None, True
    if -PERCENT_SLACK <= v <= 100.0 + PERCENT_SLACK:
        return min(100.0, max(0.0, v)), True
    return None, False


@dataclass(slots=True)
class GpmChain:
    """One chain of GPM samples: the whole GPU (``gi is None``) or MIG GPU instance ``gi``.

    ``weight`` is used when instances are combined (their memory size)."""

    gi: int | None = None
    weight: float = 1.0
    bufs: tuple[Any, Any] | None = None
    primed: bool = False
    prev_t: float = 0.0
    values: GpmValues = field(default_factory=GpmValues)
    note: str | None = None
    """Why the last window's values were left out (out of range), for the status."""

    def advance(self, nv: Any, handle: Any, now: float, min_window_s: float) -> None:
        """Take a sample if due and update :attr:`values`. Raises what ``nv`` raises; the
        chain then restarts (the next call primes it again)."""
        try:
            if self.bufs is None:
                self.bufs = (nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc())
            first, second = self.bufs
            if not self.primed:
                self._sample(nv, handle, first)
                self.primed, self.prev_t = True, now
                return
            if now - self.prev_t < min_window_s:
                return
            self._sample(nv, handle, second)
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1 = first
            mg.sample2 = second
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
            mg.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(mg)
            ok = nv.NVML_SUCCESS
            got: list[float | None] = []
            bad: list[str] = []
            for m, label in zip(mg.metrics[:2], ("DRAM bandwidth", "SM activity"),
                                strict=True):
                v, sane = as_percent(m.value) if m.nvmlReturn == ok else (None, True)
                got.append(v)
                if not sane:
                    bad.append(f"{label} {float(m.value):.4g} %")
            self.values = GpmValues(dram_bw_util=got[0], sm_activity=got[1])
            self.note = (f"{', '.join(bad)} out of range, left out (GPM counters reset?)"
                         if bad else None)
            self.bufs = (second, first)  # the later sample is the next window's first
            self.prev_t = now
        except BaseException:
            self.primed = False
            self.values = GpmValues()
            self.note = None
            raise

    def _sample(self, nv: Any, handle: Any, buf: Any) -> None:
        if self.gi is None:
            nv.nvmlGpmSampleGet(handle, buf)
        else:
            nv.nvmlGpmMigSampleGet(handle, self.gi, buf)

    def free(self, nv: Any) -> None:
        """Release the sample buffers; never raises."""
        for buf in self.bufs or ():
            try:
                nv.nvmlGpmSampleFree(buf)
            except Exception:  # freeing on the way out: nothing useful to do
                pass
        self.bufs = None
        self.primed = False


def combine(chains: Sequence[GpmChain]) -> GpmValues:
    """Weighted mean per metric over the chains that have a value (None if none has)."""

    def mean(attr: str) -> float | None:
        num = den = 0.0
        for c in chains:
            v = getattr(c.values, attr)
            if v is not None:
                num += c.weight * v
                den += c.weight
        return num / den if den > 0 else None

    return GpmValues(dram_bw_util=mean("dram_bw_util"), sm_activity=mean("sm_activity"))
