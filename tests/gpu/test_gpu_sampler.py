"""GpuSampler: the real thread, the real NvmlBackend, the injected FakeNvml, the real bus."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from llmtop.bus import EventBus
from llmtop.events import Event, GpuReading
from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend
from llmtop.gpu.sampler import GpuSampler


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class Collected:
    def __init__(self) -> None:
        self.bus = EventBus()
        self.readings: list[GpuReading] = []
        self.bus.subscribe(self._take)

    def _take(self, batch: object) -> None:
        assert isinstance(batch, list)
        self.readings.extend(e for e in batch if isinstance(e, GpuReading))

    def drain(self) -> list[GpuReading]:
        self.bus.drain()
        return self.readings


@pytest.fixture
def started() -> Iterator[list[GpuSampler]]:
    samplers: list[GpuSampler] = []
    yield samplers
    for s in samplers:
        assert s.stop(5.0)


def start(
    samplers: list[GpuSampler], fake: FakeNvml, publish: Callable[[Event], None], **kw: object
) -> GpuSampler:
    s = GpuSampler(NvmlBackend(fake), publish, **kw)  # type: ignore[arg-type]
    samplers.append(s)
    s.start()
    return s


def test_publishes_per_gpu_per_interval_and_stops_cleanly(started: list[GpuSampler]) -> None:
    """Readings for every GPU each round go to the bus; stop() joins in time and NVML is
    shut down."""
    fake = FakeNvml([FakeDevice(name="A", util_gpu=10), FakeDevice(name="B", util_gpu=20)])
    out = Collected()
    s = start(started, fake, out.bus.publish, interval_s=0.02)
    wait_for(lambda: s.rounds >= 3)
    assert s.status == "2 GPUs"
    readings = out.drain()
    assert {r.index for r in readings} == {0, 1}
    assert sum(1 for r in readings if r.index == 0) >= 3
    assert [(r.index, r.name, r.util_gpu) for r in s.latest()] == [(0, "A", 10.0), (1, "B", 20.0)]
    t0 = time.monotonic()
    assert s.stop(timeout=2.0)
    assert time.monotonic() - t0 < 2.0
    assert not s.is_alive()
    assert fake.initialised == 0 and fake.live_samples() == 0
    assert s.status == "stopped"


def test_readings_are_immutable_and_timestamped(started: list[GpuSampler]) -> None:
    fake = FakeNvml([FakeDevice()])
    out = Collected()
    s = start(started, fake, out.bus.publish, interval_s=0.02, clock=lambda: 1234.5)
    wait_for(lambda: s.rounds >= 1)
    r = out.drain()[0]
    assert r.t == 1234.5
    with pytest.raises(AttributeError):
        r.util_gpu = 1.0  # type: ignore[misc]


def test_gpm_windows_stay_at_least_100ms_at_fast_rates(started: list[GpuSampler]) -> None:
    """Sampling at 20 Hz, GPM windows are still ≥ 100 ms and the bandwidth arrives."""
    fake = FakeNvml([FakeDevice(dram_bw_util=55.0, sm_util=70.0)])
    out: list[Event] = []
    s = start(started, fake, out.append, interval_s=0.05)
    wait_for(lambda: len(fake.gpm_windows) >= 3)
    assert all(dt >= 0.1 for _, _, dt in fake.gpm_windows)
    wait_for(lambda: any(isinstance(e, GpuReading) and e.dram_bw_util for e in out))
    assert s.latest()[0].dram_bw_util == 55.0
    assert s.latest()[0].sm_activity == 70.0


def test_device_lost_mid_run_keeps_thread_and_other_gpu(started: list[GpuSampler]) -> None:
    """A GPU falling off the bus: status says so, its readings turn None, the thread and
    the other GPU carry on."""
    fake = FakeNvml([FakeDevice(util_gpu=5), FakeDevice(util_gpu=6)])
    out = Collected()
    s = start(started, fake, out.bus.publish, interval_s=0.02)
    wait_for(lambda: s.rounds >= 1)
    fake.lose(1)
    wait_for(lambda: "GPU 1 lost" in s.status)
    rounds = s.rounds
    wait_for(lambda: s.rounds >= rounds + 2)
    assert s.is_alive()
    latest = {r.index: r for r in s.latest()}
    assert latest[1].mem_total_bytes is None and latest[1].util_gpu is None
    assert latest[0].util_gpu == 5.0
    assert out.drain()[-1].index == 1  # still published, with None fields


def test_nvml_errors_mid_run_give_none_fields(started: list[GpuSampler]) -> None:
    """Errors injected mid-run: None for the affected field, noted in status, then back."""
    fake = FakeNvml([FakeDevice(power_mw=250_000)])
    s = start(started, fake, lambda e: None, interval_s=0.02)
    wait_for(lambda: bool(s.latest()) and s.latest()[0].power_w == 250.0)
    fake.fail(0, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    wait_for(lambda: s.latest()[0].power_w is None)
    assert s.latest()[0].mem_total_bytes is not None
    wait_for(lambda: s.status == "1 GPU; GPU 0 power: Unknown Error")
    fake.heal(0, "nvmlDeviceGetPowerUsage")
    wait_for(lambda: s.latest()[0].power_w == 250.0)
    wait_for(lambda: s.status == "1 GPU")
    assert s.is_alive()


class ExplodingBackend(NvmlBackend):
    """A backend with a bug: read() raises something that is not an NVML error."""

    def __init__(self, fake: FakeNvml) -> None:
        super().__init__(fake)
        self.armed = threading.Event()

    def read(self, index: int, t: float) -> GpuReading:
        if self.armed.is_set() and index == 0:
            raise RuntimeError("boom")
        return super().read(index, t)


def test_backend_bug_does_not_kill_the_thread(started: list[GpuSampler]) -> None:
    fake = FakeNvml([FakeDevice(name="A"), FakeDevice(name="B")])
    backend = ExplodingBackend(fake)
    s = GpuSampler(backend, lambda e: None, interval_s=0.02)
    started.append(s)
    s.start()
    wait_for(lambda: s.rounds >= 1)
    backend.armed.set()
    wait_for(lambda: "RuntimeError: boom" in s.status)
    latest = {r.index: r for r in s.latest()}
    assert latest[0].name == "A" and latest[0].mem_total_bytes is None
    assert latest[1].mem_total_bytes is not None
    backend.armed.clear()
    wait_for(lambda: s.status == "2 GPUs")


def test_no_nvml_library_ends_the_thread_with_a_reason() -> None:
    """nvmlInit raising NVMLError_LibraryNotFound: the thread ends at once, publishes
    nothing, and its status gives the reason."""
    fake = FakeNvml([FakeDevice()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    out: list[Event] = []
    s = GpuSampler(NvmlBackend(fake), out.append, interval_s=0.02)
    s.start()
    s.join(5.0)
    assert not s.is_alive()
    assert s.status.startswith("no NVML library")
    assert s.unavailable == s.status
    assert out == [] and s.latest() == []


def test_device_selection(started: list[GpuSampler]) -> None:
    fake = FakeNvml([FakeDevice(name="A"), FakeDevice(name="B"), FakeDevice(name="C")])
    out = Collected()
    s = start(started, fake, out.bus.publish, interval_s=0.02, devices=(2, 0))
    wait_for(lambda: s.rounds >= 2)
    assert {r.index for r in out.drain()} == {0, 2}
    assert s.status == "2 GPUs"


def test_selecting_only_absent_devices() -> None:
    fake = FakeNvml([FakeDevice()])
    s = GpuSampler(NvmlBackend(fake), lambda e: None, interval_s=0.02, devices=(3,))
    s.start()
    s.join(5.0)
    assert not s.is_alive()
    assert s.status == "GPU 3 not present (NVML sees 1 GPU)"
    assert fake.initialised == 0


def test_stop_before_start_and_twice() -> None:
    s = GpuSampler(NvmlBackend(FakeNvml([FakeDevice()])), lambda e: None)
    assert s.stop(0.1)
    s2 = GpuSampler(NvmlBackend(FakeNvml([FakeDevice()])), lambda e: None, interval_s=0.02)
    s2.start()
    assert s2.stop(2.0) and s2.stop(2.0)


def test_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        GpuSampler(NvmlBackend(FakeNvml()), lambda e: None, interval_s=0)
