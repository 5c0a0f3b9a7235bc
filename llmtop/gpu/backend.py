"""What a GPU sampler needs from a source of readings (NVML or anything else).

A backend answers for devices by index. It decides "no GPU at all" once, in :meth:`init`
(raising :class:`GpuUnavailable` with a one-line reason); after that a missing reading is
``None`` in the :class:`~llmtop.events.GpuReading`, never an exception, and a device that
disappears is reported by :meth:`GpuBackend.lost`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from llmtop.events import GpuReading


class GpuUnavailable(RuntimeError):
    """No GPU readings are possible: no library, no driver, no device, no permission.

    ``reason`` is one line meant for the user, e.g. ``"no NVML library (libnvidia-ml.so.1
    not found: is the NVIDIA driver installed?)"``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class GpuBackend(Protocol):
    """A source of per-device GPU readings, polled from one sampler thread."""

    def init(self) -> None:
        """Open the library and enumerate devices; idempotent.

        Raises :class:`GpuUnavailable` when no reading is possible at all.
        """
        ...

    def device_count(self) -> int:
        """How many devices :meth:`init` found."""
        ...

    def read(self, index: int, t: float) -> GpuReading:
        """Every field of device ``index`` now, stamped ``t``; unavailable fields are None."""
        ...

    def lost(self, index: int) -> bool:
        """True once device ``index`` has disappeared (fallen off the bus, reset, ...)."""
        ...

    def accessible(self, index: int) -> bool:
        """False for a device counted by the library that this process may not open
        (cgroups, Slurm); it is left out when "all GPUs" are sampled."""
        ...

    def last_error(self, index: int) -> str | None:
        """What went wrong reading device ``index`` last time (None: nothing), for status."""
        ...

    def shutdown(self) -> None:
        """Release the library; idempotent, never raises."""
        ...
