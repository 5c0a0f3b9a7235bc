"""Simulator profiles: every constant of the simulated engine and GPU, with where it comes from.

A :class:`SimProfile` is a frozen dataclass; :data:`PROFILES` holds the built-in ones and
:func:`get_profile` returns one with overrides applied (strings are converted to the
field's type, so ``--set max_num_seqs=8`` and config values work the same way).

The step model (see :mod:`llmtop.sim.engine`)::

    step_s = (base_step_s                       # weights read once per step
              + per_seq_s * batch               # per-sequence compute, sampling, bookkeeping
              + per_kv_token_s * context_tokens # every live KV entry re-read (memory-bound)
              + prefill_tokens / prefill_tokens_per_s) * time_scale
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final

OUTPUT_DISTS = ("fixed", "uniform", "exponential")
MAX_TIME_SCALE: Final = 1000.0
"""The slowest a simulator may run: a thousand times slower than real time."""


@dataclass(frozen=True, slots=True)
class SimProfile:
    """Every parameter of the simulated engine. All of them can be overridden."""

    name: str
    """Profile name (``tiny``, ``h200-llama8b``)."""
    model: str
    """Model name served at /v1/models and echoed when a request names none."""
    gpu_name: str
    """The simulated accelerator, as shown at /sim/gpu."""
    max_num_seqs: int
    """Sequence slots: the most requests decoded in one batch (vLLM ``max_num_seqs``)."""
    kv_cache_tokens: int
    """KV-cache capacity in tokens (prompt + generated, all running sequences together)."""
    max_model_len: int
    """Longest prompt + output one request may ask for (400 above it); ≤ kv_cache_tokens."""
    base_step_s: float
    """Fixed cost of one decode step: reading the weights once, kernel launches."""
    per_seq_s: float
    """Extra step time per running sequence (compute, sampling, scheduler bookkeeping)."""
    per_kv_token_s: float
    """Extra step time per live context token (its KV entry is re-read every step)."""
    prefill_tokens_per_s: float
    """Prompt tokens processed per second when a request is admitted (delays the step)."""
    weights_bytes: int
    """Model weights resident in GPU memory (read once per step)."""
    kv_bytes_per_token: int
    """KV-cache bytes per token (2 × layers × KV heads × head dim × dtype bytes)."""
    mem_total_bytes: int
    """GPU memory size as NVML reports it."""
    runtime_overhead_bytes: int
    """CUDA context, activations, graphs: always counted as used."""
    peak_bw_bytes_per_s: float
    """Theoretical DRAM bandwidth; dram_bw_util is bytes read ÷ step time ÷ this."""
    power_idle_w: float
    """Board power when no step runs."""
    power_max_w: float
    """Board power at 100 % DRAM bandwidth (the TDP)."""
    tokens_per_chunk: int = 1
    """Tokens per decode step and stream chunk (> 1 as speculative decoding produces)."""
    output_tokens_dist: str = "uniform"
    """Output length when a request sets no max_tokens: fixed, uniform (1 … 2×mean−1) or
    exponential (mean), clipped to max_model_len − prompt (a clipped answer ends with
    finish_reason ``length``, as vLLM's)."""
    output_tokens_mean: int = 64
    """Mean of ``output_tokens_dist``."""
    time_scale: float = 1.0
    """Multiplies every simulated duration (0.1 = ten times faster than real time), at
    most :data:`MAX_TIME_SCALE`."""

    def __post_init__(self) -> None:
        positive_ints = ("max_num_seqs", "kv_cache_tokens", "max_model_len",
                         "tokens_per_chunk", "output_tokens_mean")
        for key in positive_ints:
            if getattr(self, key) < 1:
                raise ValueError(f"sim parameter {key} must be ≥ 1, got {getattr(self, key)}")
        for key in ("base_step_s", "per_seq_s", "per_kv_token_s", "weights_bytes",
                    "kv_bytes_per_token", "runtime_overhead_bytes", "power_idle_w"):
            if getattr(self, key) < 0:
                raise ValueError(f"sim parameter {key} must be ≥ 0, got {getattr(self, key)}")
        for key in ("prefill_tokens_per_s", "peak_bw_bytes_per_s", "mem_total_bytes",
                    "time_scale"):
            if getattr(self, key) <= 0:
                raise ValueError(f"sim parameter {key} must be > 0, got {getattr(self, key)}")
        if self.time_scale > MAX_TIME_SCALE:
            raise ValueError(f"sim parameter time_scale must be at most {MAX_TIME_SCALE:g} "
                             f"(that slow, a token takes seconds), got {self.time_scale:g}")
        if not self.model.strip():
            raise ValueError("sim parameter model must not be empty (clients name it)")
        if self.max_model_len > self.kv_cache_tokens:
            raise ValueError(
                f"sim parameter max_model_len ({self.max_model_len}) must not exceed "
                f"kv_cache_tokens ({self.kv_cache_tokens})"
            )
        if self.output_tokens_dist not in OUTPUT_DISTS:
            raise ValueError(
                f"sim parameter output_tokens_dist '{self.output_tokens_dist}' is not one of "
                + ", ".join(OUTPUT_DISTS)
            )
        if self.power_max_w < self.power_idle_w:
            raise ValueError("sim parameter power_max_w must be ≥ power_idle_w")


# --- tiny -------------------------------------------------------------------------------
# A toy that saturates at a handful of requests so queueing, preemption and batch effects
# show on a 2-core laptop at human time scales. Physically it is a ~0.5B-parameter model
# in BF16 (1 GB of weights) with no grouped-query attention (32 layers × 16 KV heads ×
# 128 dims × 2 (K and V) × 2 bytes = 256 KiB of KV per token) on a small 8 GiB GPU with
# 100 GB/s of DRAM bandwidth:
#   base step  = 1 GB ÷ 100 GB/s            = 10 ms
#   per KV tok = 256 KiB ÷ 100 GB/s         ≈ 2.6 µs   (2,048 live tokens → +5.4 ms)
#   per seq    = 2 ms, deliberately large so the batch size is visible in ITL (batch 1 →
#                ≈12 ms per token, batch 4 → ≈18 ms)
#   prefill    = ~1 GFLOP/token on an ~8 TFLOPS part at 50 % → ~4,000 tokens/s
#   KV pool    = 2,048 tokens (512 MiB): four 500-token requests fill it → preemptions
TINY = SimProfile(
    name="tiny",
    model="sim-tiny",
    gpu_name="8 GiB edge GPU",
    max_num_seqs=4,
    kv_cache_tokens=2048,
    max_model_len=2048,
    base_step_s=0.010,
    per_seq_s=0.002,
    per_kv_token_s=256 * 1024 / 100e9,
    prefill_tokens_per_s=4000.0,
    weights_bytes=1_000_000_000,
    kv_bytes_per_token=256 * 1024,
    mem_total_bytes=8 * 1024**3,
    runtime_overhead_bytes=300 * 1024**2,
    peak_bw_bytes_per_s=100e9,
    power_idle_w=8.0,
    power_max_w=60.0,
    tokens_per_chunk=1,
    output_tokens_dist="uniform",
    output_tokens_mean=32,
)

# --- h200-llama8b -----------------------------------------------------------------------
# Llama-3-8B (8.03 B parameters) in BF16 on one NVIDIA H200 (141 GB HBM3e, 4.8 TB/s):
#   weights    = 8.03e9 × 2 bytes                         = 16.06 GB
#   base step  = 16.06 GB ÷ 4.8 TB/s = 3.35 ms of weight reads + ~0.65 ms of kernel
#                launches and sampling                    ≈ 4 ms (≈250 tok/s at batch 1;
#                the bandwidth ceiling is ≈300 tok/s)
#   KV/token   = 32 layers × 8 KV heads (GQA) × 128 dims × 2 (K,V) × 2 bytes = 128 KiB
#   per KV tok = 128 KiB ÷ 4.8 TB/s                       ≈ 27.3 ns (100k live tokens →
#                +2.7 ms per step)
#   per seq    = ~40 µs of per-sequence compute/sampling/bookkeeping (batch 256 → +10 ms,
#                in line with vLLM's ITL growth on Hopper at high batch)
#   prefill    = 2 × 8.03e9 FLOP/token on 989 TFLOPS dense BF16 at ~40 % MFU ≈ 25k tok/s
#   memory     = 143,771 MiB as NVML reports an H200; vLLM's gpu_memory_utilization 0.9
#                leaves 0.9 × 150.8 GB − 16.06 GB weights − ~4 GB activations/graphs
#                ≈ 115 GB of KV pool ÷ 128 KiB ≈ 880k tokens
#   max_num_seqs = 256 (vLLM's default), max_model_len = 8,192 (Llama-3-8B's context)
#   power      = ~90 W idle, 700 W TDP (H200 SXM)
H200_LLAMA8B = SimProfile(
    name="h200-llama8b",
    model="meta-llama/Meta-Llama-3-8B-Instruct",
    gpu_name="NVIDIA H200",
    max_num_seqs=256,
    kv_cache_tokens=880_000,
    max_model_len=8192,
    base_step_s=0.004,
    per_seq_s=40e-6,
    per_kv_token_s=128 * 1024 / 4.8e12,
    prefill_tokens_per_s=25_000.0,
    weights_bytes=16_060_000_000,
    kv_bytes_per_token=128 * 1024,
    mem_total_bytes=143_771 * 1024**2,
    runtime_overhead_bytes=4_000_000_000,
    peak_bw_bytes_per_s=4.8e12,
    power_idle_w=90.0,
    power_max_w=700.0,
    tokens_per_chunk=1,
    output_tokens_dist="uniform",
    output_tokens_mean=256,
)

PROFILES: dict[str, SimProfile] = {p.name: p for p in (TINY, H200_LLAMA8B)}
"""The built-in profiles by name."""

OVERRIDABLE: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(SimProfile) if f.name != "name"
)
"""Keys accepted by :func:`get_profile` overrides and ``llmtop sim --set KEY=VALUE``."""

_TYPES: dict[str, type] = {
    f.name: (f.type if isinstance(f.type, type) else {"int": int, "float": float,
                                                     "str": str}[str(f.type)])
    for f in dataclasses.fields(SimProfile)
}


def _coerce(key: str, value: Any) -> Any:
    want = _TYPES[key]
    if want is str:
        if not isinstance(value, str):
            raise ValueError(f"sim parameter {key} must be a string, got {value!r}")
        return value
    if isinstance(value, bool):
        raise ValueError(f"sim parameter {key} must be a number, got {value!r}")
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            num: float = float(text)
        except ValueError:
            raise ValueError(f"sim parameter {key} must be a number, got '{value}'") from None
    elif isinstance(value, int | float):
        num = float(value)
    else:
        raise ValueError(f"sim parameter {key} must be a number, got {value!r}")
    if not math.isfinite(num):
        raise ValueError(f"sim parameter {key} must be a finite number, got {value!r}")
    if want is int:
        if num != int(num):
            raise ValueError(f"sim parameter {key} must be a whole number, got {value!r}")
        return int(num)
    return num


def apply_overrides(profile: SimProfile, **overrides: Any) -> SimProfile:
    """``profile`` with ``overrides`` applied (values may be strings); ValueError on a bad
    key or value, naming it."""
    if not overrides:
        return profile
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise ValueError(
                f"unknown sim parameter '{key}' (known: {', '.join(OVERRIDABLE)})"
            )
        clean[key] = _coerce(key, value)
    return dataclasses.replace(profile, **clean)


def get_profile(name: str, **overrides: Any) -> SimProfile:
    """The built-in profile ``name`` with ``overrides`` applied.

    Raises ValueError with a one-line message for an unknown profile, an unknown key or a
    value of the wrong type/range.
    """
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown sim profile '{name}' (known: {', '.join(PROFILES)})"
        ) from None
    return apply_overrides(base, **overrides)


def parse_set_options(pairs: list[str]) -> dict[str, str]:
    """``["max_num_seqs=8", "time_scale=0.1"]`` → a dict of raw string overrides.

    ValueError (one line) when an item has no ``=``.
    """
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set '{item}' must look like KEY=VALUE")
        out[key.strip()] = value.strip()
    return out
