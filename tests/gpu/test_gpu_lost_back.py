"""A GPU that fell off the bus (``GPU_IS_LOST``) is asked every ``REOPEN_S`` whether it is
back, and read again when it is (a reset, a driver that recovered) — it stayed "lost",
with n/a figures, until llmtop was restarted. The real NvmlBackend and GpuSampler against
the injected FakeNvml."""

from __future__ import annotations

import pynvml
from test_gpu_nvml_backend import make

from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import REOPEN_S, NvmlBackend


def test_a_lost_gpu_is_asked_again_and_read_again_once_back() -> None:
    fake, b, clock = make(FakeDevice(name="A"), FakeDevice(name="B", util_gpu=40, sm_util=30.0))
    b.read(1, 0.0)
    fake.lose(1)
    clock.t += 0.5
    assert b.read(1, 0.5).util_gpu is None and b.lost(1)
    calls = len(fake.calls)
    clock.t += REOPEN_S - 1.0
    b.read(1, 1.0)
    assert len(fake.calls) == calls  # not yet: nothing asked of it
    clock.t += 1.0
    r = b.read(1, 2.0)  # asked once whether it is back: still lost, still n/a
    assert fake.calls[calls:] == ["nvmlDeviceGetHandleByUUID"]
    assert b.lost(1) and r.util_gpu is None and r.mem_total_bytes is None

    fake.recover(1)
    clock.t += REOPEN_S / 2
    assert b.read(1, 3.0).util_gpu is None  # the next try is REOPEN_S after the last
    clock.t += REOPEN_S / 2
    r = b.read(1, 4.0)
    assert not b.lost(1)
    assert (r.name, r.util_gpu, r.mem_total_bytes) == ("B", 40.0, fake.devices[1].mem_total)
    assert b.last_error(1) is None
    assert r.dram_bw_util is None  # GPM primed afresh: its first window is the next read
    clock.t += 0.25
    assert b.read(1, 5.0).sm_activity == 30.0
    assert fake.live_samples() == 2  # its new two; the two from before the loss freed
    assert b.read(0, 5.0).name == "A"
    b.shutdown()
    assert fake.live_samples() == 0


def test_it_is_found_by_its_uuid_not_by_the_index_another_gpu_took() -> None:
    """After the loss NVML's index 1 answers with another GPU: that is not GPU 1 back;
    GPU 1 is read again only once its own UUID answers."""
    fake, b, clock = make(FakeDevice(name="A"), FakeDevice(name="B", uuid="GPU-b"))
    b.read(1, 0.0)
    fake.lose(1)
    clock.t += 0.5
    b.read(1, 0.5)
    fake.devices[1] = FakeDevice(name="C", uuid="GPU-c")  # another board in its place
    clock.t += REOPEN_S
    r = b.read(1, 1.0)
    assert b.lost(1) and r.mem_total_bytes is None and r.name == "B"
    fake.devices[1] = FakeDevice(name="B", uuid="GPU-b", mem_used=7)
    clock.t += REOPEN_S
    r = b.read(1, 2.0)
    assert not b.lost(1) and (r.name, r.mem_used_bytes) == ("B", 7)
    b.shutdown()


def test_lost_at_start_is_asked_again_by_index() -> None:
    """No handle at start (so no UUID known): asked again by index, read once it answers."""
    dev = FakeDevice(name="B", errors={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST})
    clock_t = [100.0]
    fake = FakeNvml([FakeDevice(), dev], clock=lambda: clock_t[0])
    b = NvmlBackend(fake, monotonic=lambda: clock_t[0])
    b.init()
    assert b.lost(1) and b.name(1) == "GPU 1"
    fake.heal(1, "nvmlDeviceGetHandleByIndex")
    assert b.read(1, 0.0).mem_total_bytes is None  # not asked yet
    clock_t[0] += REOPEN_S
    r = b.read(1, 1.0)
    assert not b.lost(1) and r.name == "B" and r.mem_total_bytes == dev.mem_total
    b.shutdown()
