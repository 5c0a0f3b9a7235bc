"""NVML through nvidia-ml-py — the only module of llmtop that imports ``pynvml``.

:class:`NvmlBackend` takes the ``pynvml`` module as a constructor argument, so tests pass
:class:`llmtop.gpu.fake.FakeNvml` and the code below runs unchanged against it.

Rules (after nvitop): "no NVML at all" is decided once, in :meth:`NvmlBackend.init`; after
that every getter returns ``None`` for a reading it cannot get instead of raising. A field
that answers ``NOT_SUPPORTED`` (or ``NO_PERMISSION``) once is not asked again.
``GPU_IS_LOST`` / ``GPU_NOT_FOUND`` mark the whole device lost; it is not asked anything
else until it answers again: every :data:`REOPEN_S` a read asks for its handle again (by
its UUID when it had one, so another GPU that took its index is not read in its place) and
its memory, and when both answer it is opened afresh (a GPU reset, a driver that
recovered). A device whose handle is refused with ``NO_PERMISSION`` at init is not lost but
*inaccessible*: NVML counts every GPU of the machine even where cgroups (Slurm, some
container set-ups) let this process open only some; those are left out of "all GPUs".

Units: bytes, percent (0–100), watts, MHz, °C, bytes per second. A percentage that reads
more than a point outside 0–100 is None (a GPM window over counters that wrapped or went
back; NVML's 0xFFFFFFFF "not available"); a GPM one is also named in :meth:`last_error`.
Power, clocks, temperature and PCIe throughput that read 0xFFFFFFFF are None too.

:meth:`NvmlBackend.read` of different devices may run at once, each in its own thread
(:mod:`llmtop.gpu.sampler`): per-device state is the device's own, and NVML is
thread-safe.

DRAM bandwidth and SM activity come from GPM (GPU Performance Monitoring, Hopper and newer):
support is checked once per device with ``nvmlGpmQueryDeviceSupport``; each reading takes a
new sample and computes the metrics over the window since the previous one (at least
``gpm_min_window_s``, default 100 ms, apart), so the later sample is the next window's
first (see :mod:`llmtop.gpu.gpm`). A device in MIG mode is sampled per GPU instance
(``nvmlGpmMigSampleGet``) and the instances are combined weighted by their memory size
(bandwidth is partitioned with the memory slices); the instance list is read once, at
:meth:`NvmlBackend.init`.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from llmtop.events import GpuReading
from llmtop.gpu.backend import GpuUnavailable
from llmtop.gpu.gpm import GpmChain, GpmValues, as_percent, combine

T = TypeVar("T")

REOPEN_S = 30.0
"""How often a lost GPU is asked whether it is back (two NVML calls)."""

KIB = 1024
"""NVML reports PCIe throughput in KB/s with KB = 1024 bytes (nvidia-smi, nvitop agree)."""


def load_pynvml() -> ModuleType:
    """Import the real nvidia-ml-py module; :class:`GpuUnavailable` if it is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(f"nvidia-ml-py (pynvml) is not installed: {exc}") from None
    module: ModuleType = pynvml
    return module


def nvml_error(code: int) -> Exception:
    """A real ``pynvml.NVMLError`` for ``code`` — its matching subclass, e.g.
    ``nvml_error(NVML_ERROR_GPU_IS_LOST)`` is a ``pynvml.NVMLError_GpuIsLost``."""
    err: Exception = load_pynvml().NVMLError(code)
    return err


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    name: str
    lost: bool = False
    denied: bool = False
    """The handle was refused with NO_PERMISSION: not ours to read (not lost)."""
    gpm: bool = False
    mig: bool = False
    chains: list[GpmChain] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    gpm_error: str | None = None
    """The GPM error of the last read, if it had one (see :meth:`NvmlBackend.gpm`)."""
    answered: set[str] = field(default_factory=set)
    """Newer queries (of :meth:`NvmlBackend._either`) that have answered at least once."""
    last_error: str | None = None
    uuid: str | None = None
    reopen_at: float = 0.0
    """While lost: when (on the backend's monotonic clock) to ask whether it is back."""


NOT_AVAILABLE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
"""What NVML puts in an unsigned field it cannot read (``NVML_VALUE_NOT_AVAILABLE``): a
power draw of 4.3 MW, a temperature of 4.3e9 °C, as numbers."""


def _finite(x: Any) -> float | None:
    """``x`` as a reading: None when it is no finite number or NVML's "not available"."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v not in NOT_AVAILABLE else None


def _as_int(x: Any) -> int:
    """pynvml returns some values as ctypes objects (``nvmlDeviceIsMigDeviceHandle``)."""
    return int(getattr(x, "value", x))


class NvmlBackend:
    """:class:`~llmtop.gpu.backend.GpuBackend` over NVML. :meth:`init` and :meth:`shutdown`
    from one thread while no read runs; :meth:`read` of one device from one thread at a
    time (different devices may be read at once)."""

    def __init__(
        self,
        nvml: ModuleType | Any = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        gpm_min_window_s: float = 0.1,
    ) -> None:
        self._nvml: Any = nvml
        self._monotonic = monotonic
        self._gpm_min_window_s = gpm_min_window_s
        self._devices: list[_Device] = []
        self._initialised = False

    # -- life cycle ------------------------------------------------------------------------

    def init(self) -> None:
        """Load NVML and enumerate devices (once). Raises :class:`GpuUnavailable`."""
        if self._initialised:
            return
        if self._nvml is None:
            self._nvml = load_pynvml()
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuUnavailable(_init_reason(nv, exc)) from None
        except Exception as exc:  # NVMLLibraryMismatchError, ctypes trouble
            raise GpuUnavailable(f"NVML failed to start: {type(exc).__name__}: {exc}") from None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self._quiet_shutdown()
            raise GpuUnavailable(f"NVML could not count GPUs: {exc}") from None
        if count == 0:
            self._quiet_shutdown()
            raise GpuUnavailable("NVML found no NVIDIA GPU")
        self._devices = [self._open(i) for i in range(count)]
        if all(d.denied for d in self._devices):
            self._quiet_shutdown()
            self._devices = []
            raise GpuUnavailable(
                f"NVML sees {count} GPU{'s' if count != 1 else ''} but this process may open "
                f"none of {'them' if count != 1 else 'it'} (no permission: a cgroup or "
                "container limit?)"
            )
        self._initialised = True

    def shutdown(self) -> None:
        """Free GPM samples and shut NVML down; idempotent, never raises."""
        if not self._initialised:
            return
        nv = self._nvml
        for dev in self._devices:
            for chain in dev.chains:
                chain.free(nv)
        self._quiet_shutdown()
        self._initialised = False

    def _quiet_shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # already shut down, or the library went away
            pass

    def _open(self, index: int, handle: Any = None) -> _Device:
        """Device ``index``: its handle (``handle``, else asked by index), name, UUID, GPM
        support and MIG instances."""
        nv = self._nvml
        try:
            if handle is None:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_NO_PERMISSION:
                return _Device(index, None, f"GPU {index}", denied=True,
                               last_error="not accessible to this process (no permission)")
            return _Device(index, None, f"GPU {index}", lost=True, last_error=f"handle: {exc}",
                           reopen_at=self._monotonic() + REOPEN_S)
        dev = _Device(index, handle, f"GPU {index}")
        name = self._query(dev, "name", lambda: nv.nvmlDeviceGetName(handle))
        if name is not None:
            dev.name = name.decode() if isinstance(name, bytes) else str(name)
        uuid = self._query(dev, "uuid", lambda: nv.nvmlDeviceGetUUID(handle))
        if uuid is not None:
            dev.uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        support = self._query(dev, "gpm", lambda: nv.nvmlGpmQueryDeviceSupport(handle))
        dev.gpm = bool(support is not None and _as_int(support.isSupportedDevice))
        mode = self._query(dev, "mig", lambda: nv.nvmlDeviceGetMigMode(handle))
        dev.mig = bool(mode is not None and _as_int(mode[0]) == nv.NVML_DEVICE_MIG_ENABLE)
        if dev.mig:
            dev.chains = self._mig_chains(dev)
        else:
            dev.chains = [GpmChain()]
        return dev

    def _mig_chains(self, dev: _Device) -> list[GpmChain]:
        """One chain per GPU instance, weighted by the instance's memory size."""
        nv = self._nvml
        chains: dict[int, GpmChain] = {}
        count = self._query(dev, "mig", lambda: nv.nvmlDeviceGetMaxMigDeviceCount(dev.handle))
        for i in range(_as_int(count or 0)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
                gi = _as_int(nv.nvmlDeviceGetGpuInstanceId(mig))
            except nv.NVMLError:  # NOT_FOUND: no MIG device in this slot
                continue
            if gi in chains:  # several compute instances share one GPU instance
                continue
            try:
                weight = float(nv.nvmlDeviceGetMemoryInfo(mig).total)
            except nv.NVMLError:
                weight = 1.0
            chains[gi] = GpmChain(gi=gi, weight=weight if weight > 0 else 1.0)
        return list(chains.values())

    # -- the device list -------------------------------------------------------------------

    def device_count(self) -> int:
        """How many GPUs NVML reported at :meth:`init` (``nvidia-smi --list-gpus | wc -l``)."""
        return len(self._devices)

    def handle(self, index: int) -> Any:
        """The NVML device handle (``None`` if it could not be opened)."""
        return self._devices[index].handle

    def lost(self, index: int) -> bool:
        """True once the device has fallen off the bus or been reset (``GPU_IS_LOST``),
        until it answers again."""
        return self._devices[index].lost

    def _reopen(self, dev: _Device) -> _Device:
        """``dev`` opened afresh if it answers again, else ``dev`` (asked again later)."""
        nv = self._nvml
        dev.reopen_at = self._monotonic() + REOPEN_S
        try:
            handle = (nv.nvmlDeviceGetHandleByIndex(dev.index) if dev.uuid is None
                      else nv.nvmlDeviceGetHandleByUUID(dev.uuid))
            nv.nvmlDeviceGetMemoryInfo(handle)
        except Exception:  # NVMLError: still lost; or a binding/library in a bad state
            return dev
        for chain in dev.chains:
            chain.free(nv)
        new = self._open(dev.index, handle)  # still llmtop's GPU <index>, whatever NVML's is
        if new.uuid is None:
            new.uuid = dev.uuid
        self._devices[dev.index] = new
        return new

    def accessible(self, index: int) -> bool:
        """False for a GPU NVML counts but this process may not open (NO_PERMISSION)."""
        return not self._devices[index].denied

    def last_error(self, index: int) -> str | None:
        """The NVML error of the latest :meth:`read` of this device (NOT_SUPPORTED and
        NO_PERMISSION are not errors: those fields are simply n/a), for status lines."""
        return self._devices[index].last_error

    def driver_version(self) -> str | None:
        """The NVIDIA driver version (``nvidia-smi --query-gpu=driver_version``)."""
        try:
            v = self._nvml.nvmlSystemGetDriverVersion()
        except (self._nvml.NVMLError, AttributeError):
            return None
        return v.decode() if isinstance(v, bytes) else str(v)

    def gpm_supported(self, index: int) -> bool:
        """Whether GPM metrics (DRAM bandwidth, SM activity) are available on this device."""
        return self._devices[index].gpm

    def mig_enabled(self, index: int) -> bool:
        """``nvidia-smi --query-gpu=mig.mode.current``."""
        return self._devices[index].mig

    def mig_instances(self, index: int) -> dict[int, GpmValues]:
        """GPM values per MIG GPU instance id, as of the last :meth:`gpm` call."""
        dev = self._devices[index]
        return {c.gi: c.values for c in dev.chains if c.gi is not None}

    # -- error handling --------------------------------------------------------------------

    def _query(self, dev: _Device, fld: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None when the device is lost, the field unsupported, or NVML errs."""
        if dev.lost or dev.denied or fld in dev.unsupported:
            return None
        nv = self._nvml
        try:
            return fn()
        except nv.NVMLError as exc:
            self._note_error(dev, fld, exc)
        except AttributeError:  # a binding too old to have this function
            dev.unsupported.add(fld)
        return None

    def _either(
        self,
        dev: _Device,
        newer: tuple[str, Callable[[], T]] | None,
        older: tuple[str, Callable[[], T]],
    ) -> T | None:
        """The newer query, else the older one.

        The older one is asked when the newer is unsupported (an older driver), and also
        when the newer has never answered on this device and fails with another error:
        some drivers have the newer function and fail it every time (WSL answers
        ``nvmlDeviceGetMemoryInfo_v2`` with "Unknown Error"). If the older one then
        answers, the newer is not asked again and its error is not reported. A newer query
        that has answered before and fails now is a passing fault: None for this reading,
        no mixing of the two queries' figures."""
        if newer is None or newer[0] in dev.unsupported:
            return self._query(dev, *older)
        before = dev.last_error
        value = self._query(dev, *newer)
        if value is not None:
            dev.answered.add(newer[0])
            return value
        if newer[0] not in dev.unsupported and (dev.lost or newer[0] in dev.answered):
            return None
        value = self._query(dev, *older)
        if value is not None and newer[0] not in dev.unsupported:
            dev.unsupported.add(newer[0])  # broken here, not missing: use the older for good
            dev.last_error = before
        return value

    def _note_error(self, dev: _Device, fld: str, exc: Any) -> None:
        nv = self._nvml
        code = getattr(exc, "value", None)
        permanent = (
            nv.NVML_ERROR_NOT_SUPPORTED,
            nv.NVML_ERROR_FUNCTION_NOT_FOUND,
            nv.NVML_ERROR_NO_PERMISSION,  # e.g. profiling counters locked down in a container
        )
        if code in permanent:
            dev.unsupported.add(fld)
            if fld == "gpm":
                dev.gpm = False
            return
        if code in (nv.NVML_ERROR_GPU_IS_LOST, getattr(nv, "NVML_ERROR_GPU_NOT_FOUND", 28)):
            if not dev.lost:
                dev.reopen_at = self._monotonic() + REOPEN_S
            dev.lost = True
        dev.last_error = f"{fld}: {exc}"

    # -- per-field getters -----------------------------------------------------------------

    def name(self, index: int) -> str:
        """Product name, read once at init (``nvidia-smi --query-gpu=name``)."""
        return self._devices[index].name

    def memory(self, index: int) -> tuple[int, int] | None:
        """(used, total) bytes of device memory (``memory.used``, ``memory.total``).

        Uses the v2 query, whose ``used`` leaves out driver-reserved memory as nvidia-smi
        does; drivers without it fall back to v1 (where used = total − free). None (and
        said in :meth:`last_error`) when used is past the total: no reading."""
        dev = self._devices[index]
        nv = self._nvml
        v2 = getattr(nv, "nvmlMemory_v2", None)
        info = self._either(
            dev,
            None if v2 is None else (
                "memory_v2", lambda: nv.nvmlDeviceGetMemoryInfo(dev.handle, version=v2)
            ),
            ("memory", lambda: nv.nvmlDeviceGetMemoryInfo(dev.handle)),
        )
        if info is None:
            return None
        used, total = int(info.used), int(info.total)
        if total <= 0 or not 0 <= used <= total:  # an unsigned count gone below zero...
            if dev.last_error is None:
                dev.last_error = (f"memory: used {used} B of {total} B is no reading, "
                                  "left out")
            return None
        return used, total

    def utilization(self, index: int) -> tuple[float | None, float | None] | None:
        """(gpu %, memory busy %) over NVML's last sample period
        (``utilization.gpu``, ``utilization.memory``)."""
        dev = self._devices[index]
        nv = self._nvml
        u = self._query(dev, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(dev.handle))
        if u is None:
            return None
        # 0xFFFFFFFF ("not available") or another value that is no percentage: n/a
        gpu, busy = as_percent(u.gpu)[0], as_percent(u.memory)[0]
        if gpu is None and busy is None:
            return None
        return gpu, busy

    def util_gpu(self, index: int) -> float | None:
        """% of time one or more kernels ran (``nvidia-smi --query-gpu=utilization.gpu``)."""
        u = self.utilization(index)
        return None if u is None else u[0]

    def mem_busy(self, index: int) -> float | None:
        """% of time device memory was read or written — busy time, NOT bandwidth
        (``nvidia-smi --query-gpu=utilization.memory``)."""
        u = self.utilization(index)
        return None if u is None else u[1]

    def power_w(self, index: int) -> float | None:
        """Board power draw in watts (``nvidia-smi --query-gpu=power.draw``)."""
        dev = self._devices[index]
        mw = _finite(self._query(dev, "power",
                                 lambda: self._nvml.nvmlDeviceGetPowerUsage(dev.handle)))
        return None if mw is None else mw / 1000.0

    def power_limit_w(self, index: int) -> float | None:
        """Enforced power limit in watts (``nvidia-smi --query-gpu=enforced.power.limit``)."""
        dev = self._devices[index]
        nv = self._nvml
        mw = _finite(self._query(dev, "power_limit",
                                 lambda: nv.nvmlDeviceGetEnforcedPowerLimit(dev.handle)))
        return None if mw is None else mw / 1000.0

    def sm_clock_mhz(self, index: int) -> float | None:
        """Current SM clock in MHz (``nvidia-smi --query-gpu=clocks.sm``)."""
        dev = self._devices[index]
        nv = self._nvml
        mhz = self._query(
            dev, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(dev.handle, nv.NVML_CLOCK_SM)
        )
        return _finite(mhz)

    def mem_clock_mhz(self, index: int) -> float | None:
        """Current memory clock in MHz (``nvidia-smi --query-gpu=clocks.mem``)."""
        dev = self._devices[index]
        nv = self._nvml
        mhz = self._query(
            dev, "mem_clock", lambda: nv.nvmlDeviceGetClockInfo(dev.handle, nv.NVML_CLOCK_MEM)
        )
        return _finite(mhz)

    def temperature_c(self, index: int) -> float | None:
        """GPU core temperature in °C (``nvidia-smi --query-gpu=temperature.gpu``)."""
        dev = self._devices[index]
        nv = self._nvml
        sensor = nv.NVML_TEMPERATURE_GPU
        # nvmlDeviceGetTemperature is deprecated in NVML 13; older drivers lack the V form.
        newer = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        c = self._either(
            dev,
            None if newer is None else ("temperature_v", lambda: newer(dev.handle, sensor)),
            ("temperature", lambda: nv.nvmlDeviceGetTemperature(dev.handle, sensor)),
        )
        return _finite(c)

    def pcie_rx_bytes_s(self, index: int) -> float | None:
        """PCIe receive (host → GPU) bytes/s over the last 20 ms (``nvidia-smi dmon -s t``,
        rxpci)."""
        return self._pcie(index, "pcie_rx", "NVML_PCIE_UTIL_RX_BYTES")

    def pcie_tx_bytes_s(self, index: int) -> float | None:
        """PCIe transmit (GPU → host) bytes/s over the last 20 ms (``nvidia-smi dmon -s t``,
        txpci)."""
        return self._pcie(index, "pcie_tx", "NVML_PCIE_UTIL_TX_BYTES")

    def _pcie(self, index: int, fld: str, counter: str) -> float | None:
        dev = self._devices[index]
        nv = self._nvml
        kbs = _finite(self._query(
            dev, fld, lambda: nv.nvmlDeviceGetPcieThroughput(dev.handle, getattr(nv, counter))
        ))
        return None if kbs is None else kbs * KIB

    def gpm(self, index: int) -> GpmValues:
        """DRAM bandwidth (% of peak) and SM activity (% of SMs busy) over the window since
        the previous call (``nvidia-smi dmon --gpm-metrics 10,2``). The first call only takes
        a sample and returns Nones; calls closer than ``gpm_min_window_s`` to the previous
        sample return the last window's values. MIG: instances weighted by memory size."""
        dev = self._devices[index]
        if not _gpm_live(dev):
            return GpmValues()
        nv = self._nvml
        now = self._monotonic()
        failed = None
        for chain in dev.chains:
            if not _gpm_live(dev):
                break
            try:
                chain.advance(nv, dev.handle, now, self._gpm_min_window_s)
            except nv.NVMLError as exc:
                self._note_error(dev, "gpm", exc)
                failed = dev.last_error
            except (AttributeError, ctypes.ArgumentError, TypeError):
                dev.gpm = False  # bindings without GPM, or a handle they cannot pass
        if not _gpm_live(dev):
            return GpmValues()
        # A failed window restarts its chain, and the next read only primes it again,
        # without error but still without values: the error is said for that read too
        # (else a lasting one showed every other read only).
        if failed is None and dev.gpm_error is not None and dev.last_error is None:
            dev.last_error = dev.gpm_error
        dev.gpm_error = failed
        notes = [c.note if c.gi is None else f"GPU instance {c.gi}: {c.note}"
                 for c in dev.chains if c.note]
        if notes and dev.last_error is None:
            dev.last_error = f"gpm: {'; '.join(notes)}"
        return combine(dev.chains)

    # -- everything at once ----------------------------------------------------------------

    def read(self, index: int, t: float) -> GpuReading:
        """Every field of device ``index`` (one NVML call per field), stamped ``t``."""
        dev = self._devices[index]
        if dev.lost and self._monotonic() >= dev.reopen_at:
            dev = self._reopen(dev)
        if not dev.lost and not dev.denied:
            dev.last_error = None
        mem = self.memory(index)
        util = self.utilization(index)
        gpm = self.gpm(index)
        return GpuReading(
            t=t,
            index=index,
            name=dev.name,
            mem_used_bytes=None if mem is None else mem[0],
            mem_total_bytes=None if mem is None else mem[1],
            util_gpu=None if util is None else util[0],
            mem_busy=None if util is None else util[1],
            dram_bw_util=gpm.dram_bw_util,
            power_w=self.power_w(index),
            simulated=False,
            sm_activity=gpm.sm_activity,
            power_limit_w=self.power_limit_w(index),
            sm_clock_mhz=self.sm_clock_mhz(index),
            mem_clock_mhz=self.mem_clock_mhz(index),
            temperature_c=self.temperature_c(index),
            pcie_rx_bytes_s=self.pcie_rx_bytes_s(index),
            pcie_tx_bytes_s=self.pcie_tx_bytes_s(index),
        )


def _gpm_live(dev: _Device) -> bool:
    return dev.gpm and not dev.lost and not dev.denied


def _init_reason(nv: Any, exc: Any) -> str:
    """One line for the user on why NVML would not start."""
    code = getattr(exc, "value", None)
    if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "no NVML library (libnvidia-ml.so.1 not found: is the NVIDIA driver installed?)"
    if code == nv.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded"
    if code == nv.NVML_ERROR_NO_PERMISSION:
        return "no permission to open NVML"
    if code == nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "the NVML library and the kernel driver differ in version (reboot after an update)"
    return f"NVML failed to start: {exc}"
