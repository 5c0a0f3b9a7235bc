"""QA: a driver that has the newer NVML query but fails it every time (WSL answers
nvmlDeviceGetMemoryInfo_v2 with "Unknown Error"; some builds answer with an argument
version mismatch) must fall back to the older query, not show memory n/a for the whole run.
The real NvmlBackend and GpuSampler against the injected FakeNvml."""

from __future__ import annotations

import time

import pynvml
import pytest

from llmtop.events import Event, GpuReading
from llmtop.gpu.fake import GIB, FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend
from llmtop.gpu.sampler import GpuSampler


def make(*devices: FakeDevice) -> tuple[FakeNvml, NvmlBackend]:
    fake = FakeNvml(devices)
    backend = NvmlBackend(fake)
    backend.init()
    return fake, backend


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN,
                                  pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH])
def test_memory_v2_broken_from_the_start_falls_back_to_v1(code: int) -> None:
    fake, b = make(FakeDevice(mem_total=80 * GIB, mem_used=30 * GIB, mem_reserved=GIB))
    fake.fail(0, "nvmlDeviceGetMemoryInfo_v2", code)
    r = b.read(0, 0.0)
    assert (r.mem_used_bytes, r.mem_total_bytes) == (31 * GIB, 80 * GIB)  # v1: with reserved
    assert b.last_error(0) is None  # the user is not shown v2's error: memory is there
    r = b.read(0, 1.0)
    assert r.mem_total_bytes == 80 * GIB
    assert fake.count("nvmlDeviceGetMemoryInfo_v2") == 1  # not asked again
    assert fake.count("nvmlDeviceGetMemoryInfo") == 2


def test_temperature_v_broken_from_the_start_falls_back() -> None:
    fake, b = make(FakeDevice(temperature=52))
    fake.fail(0, "nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_UNKNOWN)
    assert b.read(0, 0.0).temperature_c == 52.0
    assert b.read(0, 1.0).temperature_c == 52.0
    assert b.last_error(0) is None
    assert fake.count("nvmlDeviceGetTemperatureV") == 1


def test_both_queries_failing_is_none_with_the_error_reported() -> None:
    fake, b = make(FakeDevice())
    fake.fail(0, "nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_UNKNOWN)
    fake.fail(0, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN)
    r = b.read(0, 0.0)
    assert r.mem_used_bytes is None and r.mem_total_bytes is None
    assert "memory" in (b.last_error(0) or "")
    fake.heal(0, "nvmlDeviceGetMemoryInfo_v2")  # v2 starts answering: it is used again
    assert b.read(0, 1.0).mem_used_bytes == 20 * GIB
    assert b.last_error(0) is None


def test_lost_during_the_newer_query_asks_nothing_more() -> None:
    fake, b = make(FakeDevice())
    fake.lose(0)
    assert b.read(0, 0.0).mem_total_bytes is None
    assert b.lost(0)
    assert fake.count("nvmlDeviceGetMemoryInfo") == 0


def test_sampler_shows_memory_on_such_a_driver() -> None:
    """End to end through the sampler thread: memory figures, status without an error."""
    fake = FakeNvml([FakeDevice(mem_total=80 * GIB, mem_used=10 * GIB, mem_reserved=0)])
    fake.fail(0, "nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_UNKNOWN)
    got: list[GpuReading] = []

    def publish(ev: Event) -> None:
        if isinstance(ev, GpuReading):
            got.append(ev)

    s = GpuSampler(NvmlBackend(fake), publish, interval_s=0.02)
    s.start()
    try:
        deadline = time.monotonic() + 5.0
        while s.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.rounds >= 2
        assert s.latest()[0].mem_used_bytes == 10 * GIB
        assert s.status == "1 GPU"
    finally:
        assert s.stop(5.0)
    assert all(r.mem_total_bytes == 80 * GIB for r in got)
