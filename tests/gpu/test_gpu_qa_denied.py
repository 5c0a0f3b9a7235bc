"""QA: NVML counts every GPU of the machine, but where cgroups limit the process (a Slurm
job given 2 of 8 GPUs, some container set-ups) nvmlDeviceGetHandleByIndex answers
NO_PERMISSION for the others. Those GPUs are not "lost": they are left out of "all GPUs",
and naming one with --gpus is a one-line error that says which GPUs may be read.
The real NvmlBackend, GpuSampler and open_gpu_source against the injected FakeNvml."""

from __future__ import annotations

import time

import pynvml
import pytest

from llmtop.config import Config, ConfigError
from llmtop.events import Event, GpuReading
from llmtop.gpu import GpuUnavailable, open_gpu_source
from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend
from llmtop.gpu.sampler import GpuSampler

DENIED = {"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_NO_PERMISSION}


def machine() -> FakeNvml:
    """4 GPUs; this process may open 1 and 3."""
    return FakeNvml([FakeDevice(name="G0", errors=dict(DENIED)), FakeDevice(name="G1"),
                     FakeDevice(name="G2", errors=dict(DENIED)), FakeDevice(name="G3")])


def run_sampler(backend: NvmlBackend, devices: tuple[int, ...] = ()) -> tuple[
        GpuSampler, list[GpuReading]]:
    got: list[GpuReading] = []

    def publish(ev: Event) -> None:
        if isinstance(ev, GpuReading):
            got.append(ev)

    s = GpuSampler(backend, publish, interval_s=0.02, devices=devices)
    s.start()
    deadline = time.monotonic() + 5.0
    while s.rounds < 2 and s.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return s, got


def test_backend_marks_them_inaccessible_not_lost() -> None:
    b = NvmlBackend(machine())
    b.init()
    assert b.device_count() == 4
    assert [b.accessible(i) for i in range(4)] == [False, True, False, True]
    assert not any(b.lost(i) for i in range(4))
    assert b.read(1, 0.0).mem_total_bytes is not None


def test_all_gpus_means_the_accessible_ones() -> None:
    s, got = run_sampler(NvmlBackend(machine()))
    try:
        assert s.rounds >= 2
        assert [(r.index, r.name) for r in s.latest()] == [(1, "G1"), (3, "G3")]
        assert s.status == "2 GPUs"  # not "4 GPUs; GPU 0,2 lost"
        assert {r.index for r in got} == {1, 3}
    finally:
        assert s.stop(5.0)


def test_sampler_with_a_denied_gpu_named() -> None:
    s, _ = run_sampler(NvmlBackend(machine()), devices=(1, 2))
    try:
        assert [r.index for r in s.latest()] == [1]
        assert "GPU 2 not accessible" in s.status and "lost" not in s.status
    finally:
        assert s.stop(5.0)


def test_none_accessible_is_gpu_unavailable() -> None:
    fake = FakeNvml([FakeDevice(errors=dict(DENIED)), FakeDevice(errors=dict(DENIED))])
    with pytest.raises(GpuUnavailable, match="sees 2 GPUs but this process may open none"):
        NvmlBackend(fake).init()
    assert fake.initialised == 0


def test_auto_with_none_accessible_disables_the_panel_with_the_reason() -> None:
    fake = FakeNvml([FakeDevice(errors=dict(DENIED))])
    handle = open_gpu_source(Config(), lambda ev: None, upstream="", nvml=fake)
    assert handle.kind == "none"
    assert handle.message is not None and "no permission" in handle.message


def test_gpus_naming_a_denied_gpu_is_a_config_error() -> None:
    cfg = Config()
    cfg.gpu.devices = [0, 1]
    fake = machine()
    with pytest.raises(ConfigError, match=r"GPU 0 not accessible .* may read GPU 1,3"):
        open_gpu_source(cfg, lambda ev: None, upstream="", nvml=fake)
    assert fake.initialised == 0
