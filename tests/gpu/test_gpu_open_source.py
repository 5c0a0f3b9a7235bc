"""open_gpu_source: choosing auto / nvml / sim / none, and the handle's life cycle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pynvml
import pytest

from llmtop.config import Config, ConfigError
from llmtop.events import Event, GpuReading
from llmtop.gpu import open_gpu_source, sim_gpu_url
from llmtop.gpu.fake import FakeDevice, FakeNvml


def cfg_with(source: str, **gpu: object) -> Config:
    cfg = Config()
    cfg.gpu.source = source
    cfg.gpu.interval_s = 0.02
    for k, v in gpu.items():
        setattr(cfg.gpu, k, v)
    return cfg


async def until(cond: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``cond`` every 10 ms for up to ``limit_s`` seconds."""
    for _ in range(int(limit_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_auto_without_nvml_library_gives_one_message() -> None:
    """auto + no library: no source, one clear line, nothing published, start/stop no-ops."""
    fake = FakeNvml([FakeDevice()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    out: list[Event] = []
    h = open_gpu_source(cfg_with("auto"), out.append, upstream="http://127.0.0.1:9", nvml=fake)
    assert h.kind == "none"
    assert h.message == (
        "no NVIDIA GPU found (NVML: no NVML library (libnvidia-ml.so.1 not found: "
        "is the NVIDIA driver installed?)); GPU panel disabled"
    )
    assert h.status == h.message
    assert h.start() == h.message  # the caller prints "llmtop: " + this, once
    await h.stop()
    assert out == [] and h.latest() == []


async def test_auto_with_gpus_samples_until_stopped() -> None:
    fake = FakeNvml([FakeDevice(util_gpu=33)])
    out: list[Event] = []
    h = open_gpu_source(cfg_with("auto"), out.append, upstream="", nvml=fake)
    assert h.kind == "nvml" and h.message is None
    assert h.start() is None
    h.start()  # idempotent
    await until(lambda: len(out) >= 2)
    assert h.status == "1 GPU"
    assert h.latest()[0].util_gpu == 33.0
    await h.stop()
    assert h.status == "stopped" and fake.initialised == 0
    n = len(out)
    await asyncio.sleep(0.06)
    assert len(out) == n


async def test_opened_but_never_started_releases_nvml() -> None:
    fake = FakeNvml([FakeDevice()])
    h = open_gpu_source(cfg_with("nvml"), lambda e: None, upstream="", nvml=fake)
    assert fake.initialised == 1
    await h.stop()
    assert fake.initialised == 0


def test_explicit_nvml_without_library_is_a_config_error() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(ConfigError, match=r"gpu\.source is 'nvml' but NVML is unavailable: the"):
        open_gpu_source(cfg_with("nvml"), lambda e: None, upstream="", nvml=fake)


def test_absent_device_selected_is_a_config_error() -> None:
    fake = FakeNvml([FakeDevice(), FakeDevice()])
    with pytest.raises(ConfigError, match=r"GPU 2,7 not present \(NVML sees 2 GPUs"):
        open_gpu_source(cfg_with("auto", devices=[0, 2, 7]), lambda e: None, upstream="",
                        nvml=fake)
    assert fake.initialised == 0


async def test_none() -> None:
    h = open_gpu_source(cfg_with("none"), lambda e: None, upstream="http://x:1")
    assert h.kind == "none" and h.message is None
    assert "off" in h.status
    h.start()
    await h.stop()


def test_sim_url() -> None:
    assert sim_gpu_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/sim/gpu"
    assert sim_gpu_url("http://a:1", "http://b:2/gpu") == "http://b:2/gpu"
    assert sim_gpu_url("") == ""
    with pytest.raises(ConfigError, match="sim"):
        open_gpu_source(cfg_with("sim"), lambda e: None, upstream="")


async def test_sim_source_from_upstream_against_llmtop_sim() -> None:
    """gpu.source = sim polls the simulator at the upstream's origin."""
    from llmtop.sim.server import running_sim

    out: list[Event] = []
    async with running_sim("tiny") as sim:
        h = open_gpu_source(cfg_with("sim"), out.append, upstream=sim.url + "/v1")
        assert h.kind == "sim"
        h.start()
        await until(lambda: bool(h.latest()))
        assert h.status == "1 simulated GPU"
        await h.stop()
    assert h.status == "stopped"
    assert all(isinstance(e, GpuReading) and e.simulated for e in out)


async def test_real_nvml_auto_on_this_machine() -> None:
    """The real nvidia-ml-py, source auto: a GPU machine samples; this one (no driver)
    carries on with exactly one line naming the reason."""
    h = open_gpu_source(cfg_with("auto"), lambda e: None, upstream="")
    try:
        if h.kind == "nvml":
            h.start()
            await until(lambda: bool(h.latest()))
            assert h.latest()[0].mem_total_bytes
        else:
            assert h.kind == "none" and h.message is not None
            assert h.message.startswith("no NVIDIA GPU found (NVML: ")
            assert h.message.endswith("; GPU panel disabled") and "\n" not in h.message
    finally:
        await h.stop()
