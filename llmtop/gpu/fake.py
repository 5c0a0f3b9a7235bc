"""A fake ``pynvml`` module for tests and dry runs: pass ``FakeNvml(...)`` to
:class:`llmtop.gpu.nvml.NvmlBackend` and the real backend code runs against it.

It implements the subset of the nvidia-ml-py API that the backend calls, with the same
names, argument order and return shapes. Errors are the real ``pynvml.NVMLError``
subclasses (``NVMLError_GpuIsLost``, ``NVMLError_NotSupported`` ...), constants and the
GPM ctypes structures are the real ones, so a mistake in how the backend uses the API shows
up here too. GPM samples are real ``c_nvmlGpmSample_t`` pointers; the fake remembers what
each one captured and fills ``c_nvmlGpmMetricsGet_t`` from the later sample, recording each
window (``gpm_windows``) so tests can check that samples are chained and ≥ 100 ms apart.

Configure devices with :class:`FakeDevice`; change their attributes at any time (the
sampler thread reads them); inject errors with :meth:`FakeNvml.fail` and
:meth:`FakeNvml.lose`.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmtop.gpu.nvml import load_pynvml

GIB = 1024**3

_CONSTANTS = (
    "NVML_SUCCESS",
    "NVML_CLOCK_SM",
    "NVML_CLOCK_MEM",
    "NVML_TEMPERATURE_GPU",
    "NVML_PCIE_UTIL_TX_BYTES",
    "NVML_PCIE_UTIL_RX_BYTES",
    "NVML_DEVICE_MIG_ENABLE",
    "NVML_DEVICE_MIG_DISABLE",
    "NVML_GPM_METRICS_GET_VERSION",
    "nvmlMemory_v2",
    "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "NVML_GPM_METRIC_SM_UTIL",
    "NVML_GPM_METRIC_SM_OCCUPANCY",
    "NVMLError",
    "c_nvmlGpmMetricsGet_t",
    "c_nvmlGpmSample_t",
    "struct_c_nvmlGpmSample_t",
)


@dataclass
class FakeMigInstance:
    """One MIG GPU instance of a :class:`FakeDevice`."""

    gi: int
    mem_total: int = 18 * GIB
    dram_bw_util: float = 0.0
    sm_util: float = 0.0


@dataclass
class FakeDevice:
    """One fake GPU. Values are in NVML's own units (mW, KB/s, MHz...)."""

    name: str = "NVIDIA H200"
    mem_total: int = 141 * GIB
    mem_used: int = 20 * GIB
    """Used by processes; NVML's v1 query adds ``mem_reserved`` to it, v2 does not."""
    mem_reserved: int = GIB // 2
    util_gpu: int = 0
    util_mem: int = 0
    power_mw: int = 120_000
    power_limit_mw: int = 700_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    temperature: int = 35
    pcie_rx_kbs: int = 0
    pcie_tx_kbs: int = 0
    gpm_supported: bool = True
    dram_bw_util: float = 0.0
    sm_util: float = 0.0
    mig: list[FakeMigInstance] = field(default_factory=list)
    """Non-empty: the device is in MIG mode with these GPU instances."""
    errors: dict[str, int] = field(default_factory=dict)
    """NVML function name → error code it raises (until removed)."""
    lost: bool = False
    """True: every call on this device raises NVMLError_GpuIsLost."""
    uuid: str = ""
    """``nvmlDeviceGetUUID``'s answer; "" gives ``GPU-fake-<index>``."""


@dataclass
class _Mem:
    total: int
    used: int
    free: int
    reserved: int = 0


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Support:
    version: int
    isSupportedDevice: int  # the pynvml field name


@dataclass(frozen=True)
class _MigHandle:
    parent: int
    slot: int


@dataclass
class _Captured:
    device: int
    gi: int | None
    t: float
    dram_bw_util: float
    sm_util: float
    sm_occupancy: float


class FakeNvml:
    """The subset of ``pynvml`` that :class:`~llmtop.gpu.nvml.NvmlBackend` calls."""

    def __init__(
        self,
        devices: Sequence[FakeDevice] = (),
        *,
        init_error: int | None = None,
        driver_version: str = "570.00 (fake)",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        real = load_pynvml()
        self._real = real
        for name in _CONSTANTS:
            setattr(self, name, getattr(real, name))
        for name in dir(real):
            if name.startswith(("NVML_ERROR_", "NVMLError_")):
                setattr(self, name, getattr(real, name))
        self.devices: list[FakeDevice] = list(devices)
        self.init_error = init_error
        self.driver_version = driver_version
        self.clock = clock
        self.initialised = 0
        self.calls: list[str] = []
        self.gpm_windows: list[tuple[int, int, float]] = []
        """Each nvmlGpmMetricsGet: (sample1 address, sample2 address, seconds apart)."""
        self._samples: dict[int, _Captured | None] = {}
        self._keep: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- test controls ---------------------------------------------------------------------

    def fail(self, index: int, function: str, code: int) -> None:
        """From now on ``function`` on device ``index`` raises the NVMLError for ``code``."""
        self.devices[index].errors[function] = code

    def heal(self, index: int, function: str) -> None:
        self.devices[index].errors.pop(function, None)

    def lose(self, index: int) -> None:
        """The device falls off the bus: every call on it raises NVMLError_GpuIsLost."""
        self.devices[index].lost = True

    def recover(self, index: int) -> None:
        """The device is back (reset, or the driver recovered): it answers again."""
        self.devices[index].lost = False

    def count(self, function: str) -> int:
        """How many times ``function`` was called."""
        return sum(1 for c in list(self.calls) if c == function)

    def live_samples(self) -> int:
        """GPM samples allocated and not yet freed."""
        return len(self._samples)

    # -- helpers ---------------------------------------------------------------------------

    def _err(self, code: int) -> Exception:
        err: Exception = self._real.NVMLError(code)
        return err

    def _enter(self, function: str) -> None:
        self.calls.append(function)
        if not self.initialised and function != "nvmlInit":
            raise self._err(self._real.NVML_ERROR_UNINITIALIZED)

    def _dev(self, function: str, handle: Any) -> FakeDevice:
        self._enter(function)
        idx = handle.parent if isinstance(handle, _MigHandle) else handle
        if not isinstance(idx, int) or not 0 <= idx < len(self.devices):
            raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[idx]
        if dev.lost:
            raise self._err(self._real.NVML_ERROR_GPU_IS_LOST)
        if function in dev.errors:
            raise self._err(dev.errors[function])
        return dev

    @staticmethod
    def _addr(sample: Any) -> int:
        return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self._err(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._dev("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> int:
        self._enter("nvmlDeviceGetHandleByUUID")
        want = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, d in enumerate(self.devices):
            if (d.uuid or f"GPU-fake-{i}") == want:
                if d.lost:
                    raise self._err(self._real.NVML_ERROR_GPU_IS_LOST)
                return i
        raise self._err(self._real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        d = self._dev("nvmlDeviceGetUUID", handle)
        return d.uuid or f"GPU-fake-{self.devices.index(d)}"

    # -- fields ----------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> _Mem:
        if version:
            d = self._dev("nvmlDeviceGetMemoryInfo_v2", handle)
            if version != self._real.nvmlMemory_v2:
                raise self._err(self._real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        else:
            d = self._dev("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(handle, _MigHandle):
            total = d.mig[handle.slot].mem_total
            return _Mem(total=total, used=0, free=total)
        free = d.mem_total - d.mem_used - d.mem_reserved
        if version:
            return _Mem(total=d.mem_total, used=d.mem_used, free=free, reserved=d.mem_reserved)
        return _Mem(total=d.mem_total, used=d.mem_total - free, free=free)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> _Util:
        d = self._dev("nvmlDeviceGetUtilizationRates", handle)
        return _Util(gpu=d.util_gpu, memory=d.util_mem)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        d = self._dev("nvmlDeviceGetClockInfo", handle)
        if clock_type == self._real.NVML_CLOCK_SM:
            return d.sm_clock
        if clock_type == self._real.NVML_CLOCK_MEM:
            return d.mem_clock
        raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        d = self._dev("nvmlDeviceGetTemperatureV", handle)
        if sensor != self._real.NVML_TEMPERATURE_GPU:
            raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
        return d.temperature

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        d = self._dev("nvmlDeviceGetTemperature", handle)
        if sensor != self._real.NVML_TEMPERATURE_GPU:
            raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
        return d.temperature

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        d = self._dev("nvmlDeviceGetPcieThroughput", handle)
        if counter == self._real.NVML_PCIE_UTIL_RX_BYTES:
            return d.pcie_rx_kbs
        if counter == self._real.NVML_PCIE_UTIL_TX_BYTES:
            return d.pcie_tx_kbs
        raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)

    # -- MIG -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        d = self._dev("nvmlDeviceGetMigMode", handle)
        if not d.mig:
            raise self._err(self._real.NVML_ERROR_NOT_SUPPORTED)
        on = self._real.NVML_DEVICE_MIG_ENABLE
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        d = self._dev("nvmlDeviceGetMaxMigDeviceCount", handle)
        return max(7, len(d.mig))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigHandle:
        d = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(d.mig):
            raise self._err(self._real.NVML_ERROR_NOT_FOUND)
        return _MigHandle(parent=int(handle), slot=index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        d = self._dev("nvmlDeviceGetGpuInstanceId", handle)
        if not isinstance(handle, _MigHandle):
            raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
        return d.mig[handle.slot].gi

    # -- GPM -------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> _Support:
        d = self._dev("nvmlGpmQueryDeviceSupport", handle)
        return _Support(version=1, isSupportedDevice=int(d.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        target = self._real.struct_c_nvmlGpmSample_t()
        sample = self._real.c_nvmlGpmSample_t(target)
        with self._lock:
            self._samples[self._addr(sample)] = None
            self._keep[self._addr(sample)] = target
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            addr = self._addr(sample)
            if addr not in self._samples:
                raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
            del self._samples[addr]
            del self._keep[addr]

    def _capture(self, d: FakeDevice, device: int, gi: int | None, sample: Any) -> Any:
        if not d.gpm_supported:
            raise self._err(self._real.NVML_ERROR_NOT_SUPPORTED)
        src: FakeDevice | FakeMigInstance = d
        if gi is not None:
            found = [m for m in d.mig if m.gi == gi]
            if not found:
                raise self._err(self._real.NVML_ERROR_NOT_FOUND)
            src = found[0]
        sm = src.sm_util
        cap = _Captured(device, gi, self.clock(), src.dram_bw_util, sm, sm * 0.8)
        with self._lock:
            addr = self._addr(sample)
            if addr not in self._samples:
                raise self._err(self._real.NVML_ERROR_INVALID_ARGUMENT)
            self._samples[addr] = cap
        return sample

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        d = self._dev("nvmlGpmSampleGet", handle)
        if d.mig:  # whole-GPU samples are not available in MIG mode
            raise self._err(self._real.NVML_ERROR_NOT_SUPPORTED)
        return self._capture(d, int(handle), None, sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        d = self._dev("nvmlGpmMigSampleGet", handle)
        return self._capture(d, int(handle), gpu_instance_id, sample)

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        real = self._real
        a1, a2 = self._addr(metrics_get.sample1), self._addr(metrics_get.sample2)
        with self._lock:
            s1, s2 = self._samples.get(a1), self._samples.get(a2)
        if metrics_get.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise self._err(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if s1 is None or s2 is None or (s1.device, s1.gi) != (s2.device, s2.gi):
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[s2.device]
        if dev.lost:
            raise self._err(real.NVML_ERROR_GPU_IS_LOST)
        if "nvmlGpmMetricsGet" in dev.errors:
            raise self._err(dev.errors["nvmlGpmMetricsGet"])
        self.gpm_windows.append((a1, a2, s2.t - s1.t))
        values = {
            real.NVML_GPM_METRIC_DRAM_BW_UTIL: s2.dram_bw_util,
            real.NVML_GPM_METRIC_SM_UTIL: s2.sm_util,
            real.NVML_GPM_METRIC_SM_OCCUPANCY: s2.sm_occupancy,
        }
        for i in range(int(metrics_get.numMetrics)):
            m = metrics_get.metrics[i]
            if m.metricId in values:
                m.value = values[m.metricId]
                m.nvmlReturn = real.NVML_SUCCESS
            else:
                m.value = 0.0
                m.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return metrics_get
