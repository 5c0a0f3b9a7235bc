"""Do llmtop's NVML readings move as they should on a real NVIDIA GPU?

Samples one GPU through llmtop's own NvmlBackend + GpuSampler at 10 Hz for ~20 s while
PyTorch runs: idle (2 s), a bf16 matrix-multiply loop (8 s, compute-bound), a
device-to-device memory-copy loop (8 s, bandwidth-bound), idle (2 s). Prints the readings
over time, each phase's medians, what torch itself measured (TFLOP/s, GB/s), and a verdict
per phase:

- matmul: SM activity (GPM) and GPU utilisation high;
- copy: DRAM bandwidth (GPM) high — and higher than during matmul; memory busy % is
  shown next to it because it is busy *time*, not bandwidth;
- idle: utilisation low.

Always exits 0: it reports, it does not gate. Without a GPU (or NVIDIA driver) it prints
``no GPU: <reason>``; without torch it samples the idle GPU only.

    python benchmarks/gpu_check.py [--device N] [--phase-s 8] [--idle-s 2] [--hz 10]
    python benchmarks/gpu_check.py --fake   # dry run against llmtop.gpu.fake.FakeNvml

Needs only ``pip install -e .`` and, for the load phases, ``torch`` with CUDA. The torch
device is ``cuda:N`` for NVML index N: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on machines
with several different GPUs so the two numberings agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmtop.events import Event, GpuReading
from llmtop.gpu.backend import GpuUnavailable
from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend
from llmtop.gpu.sampler import GpuSampler

GIB = 1024**3
PEAK_BW = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 SXM": 3.35e12, "B200": 8.0e12}
"""Theoretical DRAM bandwidth, bytes/s, by product-name fragment (for a cross-check)."""


@dataclass
class Phase:
    name: str
    start: float
    end: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)


# -- workloads ---------------------------------------------------------------------------


def torch_workload(device: int) -> tuple[Callable[[str, float, Phase], None] | None, str]:
    """A runner for the matmul and copy phases, or None and why not."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch not installed ({exc}); sampling the idle GPU only"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device; sampling the idle GPU only"
    dev = torch.device(f"cuda:{device}")

    def run(kind: str, seconds: float, phase: Phase) -> None:
        deadline = time.monotonic() + seconds
        if kind == "matmul":
            n = 8192
            a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            torch.cuda.synchronize(dev)
            iters, t0 = 0, time.monotonic()
            while time.monotonic() < deadline:
                for _ in range(10):
                    torch.matmul(a, b)
                torch.cuda.synchronize(dev)
                iters += 10
            dt = time.monotonic() - t0
            phase.figures["torch TFLOP/s"] = 2 * n**3 * iters / dt / 1e12
            del a, b
        else:
            nbytes = 4 * GIB
            src = torch.empty(nbytes, device=dev, dtype=torch.uint8).fill_(1)
            dst = torch.empty_like(src)
            torch.cuda.synchronize(dev)
            iters, t0 = 0, time.monotonic()
            while time.monotonic() < deadline:
                for _ in range(5):
                    dst.copy_(src)
                torch.cuda.synchronize(dev)
                iters += 5
            dt = time.monotonic() - t0
            phase.figures["torch copy GB/s (read+write)"] = 2 * nbytes * iters / dt / 1e9
            del src, dst
        torch.cuda.empty_cache()

    return run, f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}"


def fake_workload(fake: FakeNvml) -> Callable[[str, float, Phase], None]:
    """Sets the fake GPU to what a real one should show in each phase (dry run only)."""

    def run(kind: str, seconds: float, phase: Phase) -> None:
        d = fake.devices[0]
        if kind == "matmul":
            d.util_gpu, d.util_mem, d.sm_util, d.dram_bw_util, d.power_mw = 100, 35, 96, 22, 650_000
        else:
            d.util_gpu, d.util_mem, d.sm_util, d.dram_bw_util, d.power_mw = 100, 92, 45, 88, 480_000
        time.sleep(seconds)
        d.util_gpu, d.util_mem, d.sm_util, d.dram_bw_util, d.power_mw = 0, 0, 0, 0, 90_000

    return run


# -- report ------------------------------------------------------------------------------


def fmt(v: float | None, spec: str = ".0f") -> str:
    return "n/a" if v is None else format(v, spec)


def phase_of(t: float, phases: list[Phase]) -> str:
    for p in phases:
        if p.start <= t < p.end:
            return p.name
    return "-"


def median(rows: list[GpuReading], attr: str) -> float | None:
    vals = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
    return statistics.median(vals) if vals else None


def print_table(readings: list[GpuReading], phases: list[Phase], every: int) -> None:
    t0 = phases[0].start
    head = (f"{'t s':>6} {'phase':<8} {'util%':>5} {'busy%':>5} {'dramBW%':>7} {'SM%':>5} "
            f"{'mem GiB':>8} {'power W':>7} {'SM MHz':>6}")
    print(head)
    print("-" * len(head))
    for r in readings[::every]:
        mem = None if r.mem_used_bytes is None else r.mem_used_bytes / GIB
        print(f"{r.t - t0:6.1f} {phase_of(r.t, phases):<8} {fmt(r.util_gpu):>5} "
              f"{fmt(r.mem_busy):>5} {fmt(r.dram_bw_util, '.1f'):>7} "
              f"{fmt(r.sm_activity, '.1f'):>5} {fmt(mem, '.1f'):>8} {fmt(r.power_w):>7} "
              f"{fmt(r.sm_clock_mhz):>6}")


def verdicts(readings: list[GpuReading], phases: list[Phase], gpm: bool, name: str,
             loaded: bool) -> None:
    by_phase = {p.name: [r for r in readings if phase_of(r.t, [p]) == p.name] for p in phases}
    print("\nper phase (medians):")
    print(f"{'phase':<8} {'n':>4} {'util%':>6} {'busy%':>6} {'dramBW%':>8} {'SM%':>6} "
          f"{'power W':>8}  workload")
    med: dict[str, dict[str, float | None]] = {}
    for p in phases:
        rows = by_phase[p.name]
        m = {a: median(rows, a) for a in ("util_gpu", "mem_busy", "dram_bw_util",
                                          "sm_activity", "power_w")}
        med[p.name] = m
        figs = ", ".join(f"{k} {v:.1f}" for k, v in p.figures.items())
        print(f"{p.name:<8} {len(rows):>4} {fmt(m['util_gpu']):>6} {fmt(m['mem_busy']):>6} "
              f"{fmt(m['dram_bw_util'], '.1f'):>8} {fmt(m['sm_activity'], '.1f'):>6} "
              f"{fmt(m['power_w']):>8}  {figs}")

    def check(label: str, ok: bool | None, detail: str) -> None:
        word = "n/a" if ok is None else ("OK" if ok else "UNEXPECTED")
        print(f"  {label:<8} {word:<10} {detail}")

    def ge(v: float | None, x: float) -> bool | None:
        return None if v is None else v >= x

    print("\nverdict:")
    idle_util = med.get("idle", {}).get("util_gpu")
    check("idle", None if idle_util is None else idle_util <= 10,
          f"util_gpu {fmt(idle_util)}% (expect ≤ 10 unless others use the GPU)")
    if not loaded:
        print("  (no load phases: torch with CUDA is needed for matmul and copy)")
        return
    mm, cp = med["matmul"], med["copy"]
    check("matmul", ge(mm["util_gpu"], 80), f"util_gpu {fmt(mm['util_gpu'])}% (expect ≥ 80)")
    if gpm:
        check("matmul", ge(mm["sm_activity"], 50),
              f"SM activity {fmt(mm['sm_activity'], '.1f')}% (GPM; expect ≥ 50)")
        check("copy", ge(cp["dram_bw_util"], 50),
              f"DRAM bandwidth {fmt(cp['dram_bw_util'], '.1f')}% of peak (GPM; expect ≥ 50)")
        a, b = cp["dram_bw_util"], mm["dram_bw_util"]
        check("copy", None if a is None or b is None else a > b,
              f"DRAM bandwidth copy {fmt(a, '.1f')}% > matmul {fmt(b, '.1f')}%")
        peak = next((bw for frag, bw in PEAK_BW.items() if frag in name), None)
        measured = next((p.figures.get("torch copy GB/s (read+write)") for p in phases
                         if p.name == "copy"), None)
        if peak and a is not None and measured:
            print(f"  copy     cross-check: {a:.1f}% of {peak / 1e12:.2f} TB/s = "
                  f"{a / 100 * peak / 1e9:.0f} GB/s vs torch-measured {measured:.0f} GB/s")
    else:
        check("copy", None, "no GPM on this GPU: DRAM bandwidth and SM activity are n/a")
    print(f"  copy     memory busy {fmt(cp['mem_busy'])}% — busy time, not bandwidth "
          "(compare it with the GPM figure above)")


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU (default 0)")
    ap.add_argument("--phase-s", type=float, default=8.0, help="seconds per load phase")
    ap.add_argument("--idle-s", type=float, default=2.0, help="idle seconds before and after")
    ap.add_argument("--hz", type=float, default=10.0, help="sampling rate")
    ap.add_argument("--every", type=int, default=5, help="print every Nth reading")
    ap.add_argument("--fake", action="store_true", help="dry run on a fake NVML (no GPU)")
    args = ap.parse_args(argv)

    fake: FakeNvml | None = None
    if args.fake:
        fake = FakeNvml([FakeDevice(name="NVIDIA H200 (fake)", power_mw=90_000)])
    backend = NvmlBackend(fake)
    try:
        backend.init()
    except GpuUnavailable as exc:
        print(f"no GPU: {exc.reason}")
        return 0
    if not 0 <= args.device < backend.device_count():
        print(f"no GPU: index {args.device} not present (NVML sees {backend.device_count()})")
        backend.shutdown()
        return 0
    i = args.device
    name = backend.name(i)
    mem = backend.memory(i)
    print(f"GPU {i}: {name}, driver {backend.driver_version() or 'n/a'}, "
          f"{fmt(None if mem is None else mem[1] / GIB, '.0f')} GiB, "
          f"GPM {'yes' if backend.gpm_supported(i) else 'no'}, "
          f"MIG {'on' if backend.mig_enabled(i) else 'off'}")
    gpm = backend.gpm_supported(i)

    work: Callable[[str, float, Phase], Any] | None
    if fake is not None:
        work, why = fake_workload(fake), "fake workload (dry run: the numbers are made up)"
    else:
        work, why = torch_workload(i)
    print(f"workload: {why}")

    readings: list[GpuReading] = []
    lock = threading.Lock()

    def publish(e: Event) -> None:
        if isinstance(e, GpuReading):
            with lock:
                readings.append(e)

    sampler = GpuSampler(backend, publish, interval_s=1.0 / args.hz, devices=(i,))
    phases: list[Phase] = []

    def phase(name: str, seconds: float, kind: str | None) -> None:
        p = Phase(name, time.time())
        phases.append(p)
        if kind is None or work is None:
            time.sleep(seconds)
        else:
            work(kind, seconds, p)
        p.end = time.time()

    sampler.start()
    try:
        time.sleep(0.3)  # first GPM window
        phase("idle", args.idle_s, None)
        if work is not None:
            phase("matmul", args.phase_s, "matmul")
            phase("copy", args.phase_s, "copy")
            phase("idle-end", args.idle_s, None)
        else:
            phase("idle-end", 2 * args.phase_s, None)
    finally:
        sampler.stop(5.0)
    print(f"sampler: {len(readings)} readings at {args.hz:g} Hz; status {sampler.status!r}\n")
    with lock:
        rows = list(readings)
    print_table(rows, phases, max(1, args.every))
    verdicts(rows, phases, gpm, name, loaded=work is not None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
