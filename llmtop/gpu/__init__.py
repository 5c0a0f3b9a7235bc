"""GPU telemetry: NVML (``nvml.py``, the only ``pynvml`` importer), the sampler thread, the
simulator's ``/sim/gpu`` source, and :func:`open_gpu_source` which picks one by config.

Importing this package does not import ``pynvml``; :class:`~llmtop.gpu.nvml.NvmlBackend`
loads it when initialised.
"""

from llmtop.gpu.backend import GpuBackend, GpuUnavailable
from llmtop.gpu.sampler import GpuSampler
from llmtop.gpu.simsource import SimGpuSource
from llmtop.gpu.start import GpuSourceHandle, open_gpu_source, sim_gpu_url

__all__ = [
    "GpuBackend",
    "GpuSampler",
    "GpuSourceHandle",
    "GpuUnavailable",
    "SimGpuSource",
    "open_gpu_source",
    "sim_gpu_url",
]
