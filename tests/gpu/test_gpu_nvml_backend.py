"""NvmlBackend against the injected FakeNvml: the real backend code, fake hardware."""

from __future__ import annotations

import itertools

import pynvml
import pytest

from llmtop.gpu.backend import GpuBackend, GpuUnavailable
from llmtop.gpu.fake import GIB, FakeDevice, FakeMigInstance, FakeNvml
from llmtop.gpu.nvml import NvmlBackend, nvml_error


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(*devices: FakeDevice) -> tuple[FakeNvml, NvmlBackend, Clock]:
    clock = Clock()
    fake = FakeNvml(devices or (FakeDevice(),), clock=clock)
    backend = NvmlBackend(fake, monotonic=clock)
    backend.init()
    return fake, backend, clock


def test_backend_satisfies_protocol() -> None:
    """NvmlBackend is a GpuBackend (runtime-checkable protocol)."""
    assert isinstance(NvmlBackend(FakeNvml()), GpuBackend)


def test_every_field_with_units() -> None:
    """Each getter returns the fake's value converted to llmtop's units."""
    dev = FakeDevice(
        name="NVIDIA H200", mem_total=141 * GIB, mem_used=37 * GIB, util_gpu=88, util_mem=41,
        power_mw=512_345, power_limit_mw=700_000, sm_clock=1755, mem_clock=2619,
        temperature=61, pcie_rx_kbs=2_000, pcie_tx_kbs=3_000,
    )
    _, b, _ = make(dev)
    assert b.device_count() == 1
    assert b.driver_version() == "570.00 (fake)"
    assert b.name(0) == "NVIDIA H200"
    assert b.memory(0) == (37 * GIB, 141 * GIB)
    assert b.util_gpu(0) == 88.0
    assert b.mem_busy(0) == 41.0
    assert b.power_w(0) == pytest.approx(512.345)
    assert b.power_limit_w(0) == 700.0
    assert b.sm_clock_mhz(0) == 1755.0
    assert b.mem_clock_mhz(0) == 2619.0
    assert b.temperature_c(0) == 61.0
    assert b.pcie_rx_bytes_s(0) == 2_000 * 1024
    assert b.pcie_tx_bytes_s(0) == 3_000 * 1024
    r = b.read(0, 5.0)
    assert (r.t, r.index, r.name, r.simulated) == (5.0, 0, "NVIDIA H200", False)
    assert (r.mem_used_bytes, r.mem_total_bytes) == (37 * GIB, 141 * GIB)
    assert (r.util_gpu, r.mem_busy, r.power_limit_w) == (88.0, 41.0, 700.0)
    assert (r.sm_clock_mhz, r.mem_clock_mhz, r.temperature_c) == (1755.0, 2619.0, 61.0)
    assert (r.pcie_rx_bytes_s, r.pcie_tx_bytes_s) == (2_048_000.0, 3_072_000.0)


def test_memory_v2_excludes_reserved_and_v1_fallback() -> None:
    """used as nvidia-smi shows it (v2: reserved left out); an old driver without the v2
    query falls back to v1 (used = total − free) and does not ask v2 again."""
    dev = FakeDevice(mem_total=100 * GIB, mem_used=30 * GIB, mem_reserved=GIB)
    fake, b, _ = make(dev)
    assert b.memory(0) == (30 * GIB, 100 * GIB)
    fake.fail(0, "nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert b.memory(0) == (31 * GIB, 100 * GIB)
    assert b.memory(0) == (31 * GIB, 100 * GIB)
    assert fake.count("nvmlDeviceGetMemoryInfo_v2") == 2


def test_temperature_falls_back_on_drivers_without_the_v_query() -> None:
    fake, b, _ = make(FakeDevice(temperature=44))
    fake.fail(0, "nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert b.temperature_c(0) == 44.0
    assert b.temperature_c(0) == 44.0
    assert fake.count("nvmlDeviceGetTemperatureV") == 1
    assert fake.count("nvmlDeviceGetTemperature") == 2


def test_no_permission_is_na_not_an_error() -> None:
    """Profiling counters locked down (NO_PERMISSION): GPM n/a, not retried, no error."""
    fake, b, clock = make(FakeDevice(dram_bw_util=50.0))
    fake.fail(0, "nvmlGpmSampleGet", pynvml.NVML_ERROR_NO_PERMISSION)
    b.read(0, 0.0)
    clock.t += 0.2
    r = b.read(0, 0.2)
    assert r.dram_bw_util is None and not b.gpm_supported(0)
    assert b.last_error(0) is None
    assert fake.count("nvmlGpmSampleGet") == 1


def test_memory_error_is_none_without_fallback() -> None:
    """A v2 query that has answered before and fails now: None, v1's figure not mixed in
    (drivers that fail v2 from the start: tests/gpu/test_gpu_qa_fallback.py)."""
    fake, b, _ = make(FakeDevice())
    assert b.memory(0) is not None
    fake.fail(0, "nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_UNKNOWN)
    assert b.memory(0) is None
    assert fake.count("nvmlDeviceGetMemoryInfo") == 0


def test_gpm_two_samples_chained_and_100ms_apart() -> None:
    """GPM: first read primes, later reads compute over windows ≥ 100 ms whose later sample
    is the next window's first; reads closer than 100 ms reuse the last window."""
    fake, b, clock = make(FakeDevice(dram_bw_util=63.5, sm_util=91.0))
    assert b.gpm_supported(0)
    first = b.read(0, 0.0)
    assert first.dram_bw_util is None and first.sm_activity is None
    clock.t += 0.25
    r = b.read(0, 0.25)
    assert (r.dram_bw_util, r.sm_activity) == (63.5, 91.0)
    fake.devices[0].dram_bw_util = 12.0
    clock.t += 0.05  # too soon: no new sample, last window's values
    before = fake.count("nvmlGpmSampleGet")
    assert b.read(0, 0.3).dram_bw_util == 63.5
    assert fake.count("nvmlGpmSampleGet") == before
    clock.t += 0.1
    assert b.read(0, 0.4).dram_bw_util == 12.0
    clock.t += 0.5
    b.read(0, 0.9)
    windows = fake.gpm_windows
    assert len(windows) == 3
    assert all(dt >= 0.1 for _, _, dt in windows)
    for (_, later, _), (earlier, _, _) in itertools.pairwise(windows):
        assert later == earlier
    assert fake.live_samples() == 2  # two buffers per device, swapped, never re-allocated
    b.shutdown()
    assert fake.live_samples() == 0


def test_gpm_unsupported_device() -> None:
    """No GPM: bandwidth and SM activity are None, GPM is never sampled, the rest works."""
    fake, b, clock = make(FakeDevice(gpm_supported=False, util_gpu=50))
    assert not b.gpm_supported(0)
    for _ in range(3):
        r = b.read(0, clock.t)
        clock.t += 0.5
    assert r.dram_bw_util is None and r.sm_activity is None
    assert r.util_gpu == 50.0
    assert fake.count("nvmlGpmSampleGet") == 0
    assert fake.count("nvmlGpmQueryDeviceSupport") == 1


def test_gpm_support_query_missing_from_driver() -> None:
    """An old driver without GPM (FUNCTION_NOT_FOUND) counts as unsupported, not an error."""
    dev = FakeDevice(errors={"nvmlGpmQueryDeviceSupport": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
    _, b, _ = make(dev)
    assert not b.gpm_supported(0)
    assert b.read(0, 0.0).mem_total_bytes == dev.mem_total


def test_gpm_stops_when_metrics_get_is_not_supported() -> None:
    """NOT_SUPPORTED from nvmlGpmMetricsGet mid-run switches GPM off for that device."""
    fake, b, clock = make(FakeDevice(dram_bw_util=30.0))
    b.read(0, 0.0)
    fake.fail(0, "nvmlGpmMetricsGet", pynvml.NVML_ERROR_NOT_SUPPORTED)
    clock.t += 0.2
    assert b.read(0, 0.2).dram_bw_util is None
    assert not b.gpm_supported(0)
    n = fake.count("nvmlGpmSampleGet")
    clock.t += 0.2
    b.read(0, 0.4)
    assert fake.count("nvmlGpmSampleGet") == n


def test_gpm_transient_error_restarts_the_chain() -> None:
    """A transient GPM error gives None for that window; the next two samples recover."""
    fake, b, clock = make(FakeDevice(dram_bw_util=30.0))
    b.read(0, 0.0)
    fake.fail(0, "nvmlGpmSampleGet", pynvml.NVML_ERROR_UNKNOWN)
    clock.t += 0.2
    assert b.read(0, 0.2).dram_bw_util is None
    fake.heal(0, "nvmlGpmSampleGet")
    clock.t += 0.2
    assert b.read(0, 0.4).dram_bw_util is None  # primes again
    clock.t += 0.2
    assert b.read(0, 0.6).dram_bw_util == 30.0
    assert b.gpm_supported(0)


def test_unsupported_field_is_none_and_not_asked_again() -> None:
    """A field answering NOT_SUPPORTED is None from then on without further NVML calls."""
    fake, b, _ = make(FakeDevice(power_mw=300_000))
    fake.fail(0, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
    r = b.read(0, 0.0)
    assert r.power_w is None
    assert r.mem_total_bytes is not None and r.temperature_c == 35.0
    fake.heal(0, "nvmlDeviceGetPowerUsage")
    b.read(0, 1.0)
    assert fake.count("nvmlDeviceGetPowerUsage") == 1
    assert b.last_error(0) is None  # NOT_SUPPORTED is not an error


def test_transient_error_mid_run_is_none_then_recovers() -> None:
    """Any other NVML error mid-run is None for that reading only, and noted for status."""
    fake, b, _ = make(FakeDevice(util_gpu=70, util_mem=20))
    assert b.read(0, 0.0).util_gpu == 70.0
    fake.fail(0, "nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_TIMEOUT)
    r = b.read(0, 1.0)
    assert r.util_gpu is None and r.mem_busy is None
    assert r.mem_used_bytes is not None
    assert "utilization" in (b.last_error(0) or "")
    fake.heal(0, "nvmlDeviceGetUtilizationRates")
    assert b.read(0, 2.0).util_gpu == 70.0
    assert b.last_error(0) is None
    assert not b.lost(0)


def test_device_lost_mid_run() -> None:
    """GPU_IS_LOST marks the device gone: all-None readings, no more calls on it, the
    other GPU unaffected."""
    fake, b, clock = make(FakeDevice(name="A"), FakeDevice(name="B", util_gpu=40))
    b.read(0, 0.0)
    b.read(1, 0.0)
    fake.lose(1)
    clock.t += 0.5
    r = b.read(1, 0.5)
    assert b.lost(1) and not b.lost(0)
    assert r.name == "B" and r.index == 1
    values = [r.mem_used_bytes, r.mem_total_bytes, r.util_gpu, r.mem_busy, r.dram_bw_util,
              r.power_w, r.sm_activity, r.power_limit_w, r.sm_clock_mhz, r.mem_clock_mhz,
              r.temperature_c, r.pcie_rx_bytes_s, r.pcie_tx_bytes_s]
    assert values == [None] * len(values)
    calls = len(fake.calls)
    b.read(1, 1.0)
    assert len(fake.calls) == calls  # nothing asked of a lost GPU
    assert b.read(0, 1.0).mem_total_bytes is not None


def test_device_lost_before_init_handle() -> None:
    """A device whose handle cannot be opened is lost from the start, named by index."""
    dev = FakeDevice(errors={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST})
    _, b, _ = make(FakeDevice(), dev)
    assert b.device_count() == 2
    assert b.lost(1) and b.name(1) == "GPU 1"
    assert b.read(1, 0.0).mem_total_bytes is None


def test_mig_gpm_per_gpu_instance_weighted_by_memory() -> None:
    """MIG mode: GPM sampled per GPU instance with nvmlGpmMigSampleGet and combined
    weighted by each instance's memory."""
    dev = FakeDevice(mig=[
        FakeMigInstance(gi=1, mem_total=10 * GIB, dram_bw_util=10.0, sm_util=20.0),
        FakeMigInstance(gi=2, mem_total=30 * GIB, dram_bw_util=50.0, sm_util=60.0),
    ])
    fake, b, clock = make(dev)
    assert b.mig_enabled(0)
    b.read(0, 0.0)
    clock.t += 0.2
    r = b.read(0, 0.2)
    assert r.dram_bw_util == pytest.approx(40.0)
    assert r.sm_activity == pytest.approx(50.0)
    assert b.mig_instances(0)[2].dram_bw_util == 50.0
    assert fake.count("nvmlGpmMigSampleGet") == 4
    assert fake.count("nvmlGpmSampleGet") == 0


def test_errors_are_the_real_pynvml_classes() -> None:
    """The fake raises nvidia-ml-py's own exception subclasses."""
    fake = FakeNvml([FakeDevice(lost=True)])
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetName(0)
    assert isinstance(nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED), pynvml.NVMLError_NotSupported)


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVML library"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to start"),
    ],
)
def test_init_failures_give_one_clear_reason(code: int, needle: str) -> None:
    """nvmlInit failing becomes GpuUnavailable with a one-line reason."""
    b = NvmlBackend(FakeNvml([FakeDevice()], init_error=code))
    with pytest.raises(GpuUnavailable) as info:
        b.init()
    assert needle in info.value.reason
    assert "\n" not in info.value.reason


def test_no_devices() -> None:
    """NVML starts but sees no GPU: unavailable, and NVML is shut down again."""
    fake = FakeNvml([])
    with pytest.raises(GpuUnavailable, match="no NVIDIA GPU"):
        NvmlBackend(fake).init()
    assert fake.initialised == 0


def test_init_and_shutdown_are_idempotent() -> None:
    fake, b, _ = make(FakeDevice())
    b.init()
    assert fake.count("nvmlInit") == 1
    b.shutdown()
    b.shutdown()
    assert fake.count("nvmlShutdown") == 1 and fake.initialised == 0


def test_real_pynvml_on_this_machine() -> None:
    """The real nvidia-ml-py here: either it works (a GPU machine) or it says why in one
    line — never a traceback. (This development machine has no NVIDIA driver.)"""
    b = NvmlBackend()
    try:
        b.init()
    except GpuUnavailable as exc:
        assert exc.reason and "\n" not in exc.reason
        assert "NVML" in exc.reason or "NVIDIA" in exc.reason
        return
    try:
        assert b.device_count() >= 1
        r = b.read(0, 0.0)
        assert r.mem_total_bytes is not None and r.mem_total_bytes > 0
    finally:
        b.shutdown()
