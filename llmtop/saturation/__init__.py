"""Saturation warnings (QUEUEING, SLO_*, KV_CACHE, GPU_MEMORY, BANDWIDTH, ERRORS,
UPSTREAM_DOWN, UPSTREAM_STALLED, PREFILL_INTERFERENCE): detect, explain and clear with
hysteresis."""

from llmtop.saturation.monitor import SaturationMonitor

__all__ = ["SaturationMonitor"]
