"""A GPU whose NVML calls hang (a GPU in a bad state can take seconds per call, or never
answer) must not hold up the readings of the other GPUs: the real sampler thread and the
real NvmlBackend against the injected FakeNvml, one of whose devices blocks in
nvmlDeviceGetPowerUsage until the test lets it go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from llmtop.events import Event, GpuReading
from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend
from llmtop.gpu.sampler import GpuSampler


class HangingNvml(FakeNvml):
    """Device ``stuck`` blocks in nvmlDeviceGetPowerUsage while ``gate`` is clear."""

    def __init__(self, devices: list[FakeDevice], stuck: int) -> None:
        super().__init__(devices)
        self.stuck = stuck
        self.gate = threading.Event()
        self.gate.set()
        self.hung = threading.Event()

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        if handle == self.stuck and not self.gate.is_set():
            self.hung.set()
            self.gate.wait(30.0)
        return super().nvmlDeviceGetPowerUsage(handle)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_a_hanging_gpu_does_not_stop_the_readings_of_the_others() -> None:
    """GPU 1 hangs in an NVML call: GPU 0 is still read every interval, the status names
    GPU 1 as not answering; when GPU 1 answers again its readings come back."""
    fake = HangingNvml([FakeDevice(name="A", util_gpu=7), FakeDevice(name="B")], stuck=1)
    got: list[GpuReading] = []
    lock = threading.Lock()

    def publish(ev: Event) -> None:
        if isinstance(ev, GpuReading):
            with lock:
                got.append(ev)

    def count(index: int) -> int:
        with lock:
            return sum(1 for r in got if r.index == index)

    s = GpuSampler(NvmlBackend(fake), publish, interval_s=0.05)
    s.start()
    try:
        wait_for(lambda: s.rounds >= 2)
        fake.gate.clear()
        assert fake.hung.wait(5.0)
        before = count(0)
        # 20 intervals' worth: GPU 0 must have been read many times over
        wait_for(lambda: count(0) >= before + 10)
        wait_for(lambda: "GPU 1 not answering" in s.status)
        assert s.status.startswith("2 GPUs")
        assert s.is_alive()
        stuck_at = count(1)
        fake.gate.set()
        wait_for(lambda: count(1) >= stuck_at + 3)
        wait_for(lambda: s.status == "2 GPUs")
    finally:
        fake.gate.set()
        assert s.stop(5.0)
    assert fake.initialised == 0 and fake.live_samples() == 0
    assert s.status == "stopped"


def test_stop_is_prompt_while_a_gpu_hangs() -> None:
    """stop() returns within its timeout even though a device is inside an NVML call;
    NVML is not shut down under that call."""
    fake = HangingNvml([FakeDevice(), FakeDevice()], stuck=0)
    s = GpuSampler(NvmlBackend(fake), lambda ev: None, interval_s=0.05)
    s.start()
    try:
        wait_for(lambda: s.rounds >= 1)
        fake.gate.clear()
        assert fake.hung.wait(5.0)
        t0 = time.monotonic()
        assert s.stop(2.0)
        assert time.monotonic() - t0 < 2.0
        assert fake.initialised == 1  # not shut down under the hanging call
    finally:
        fake.gate.set()


class SlowNvml(FakeNvml):
    """Every nvmlDeviceGetPowerUsage takes ``delay_s``: slow, but it returns."""

    def __init__(self, devices: list[FakeDevice], delay_s: float) -> None:
        super().__init__(devices)
        self.delay_s = delay_s

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        time.sleep(self.delay_s)
        return super().nvmlDeviceGetPowerUsage(handle)


def test_stop_during_a_slow_read_still_shuts_nvml_down() -> None:
    """A read that is slow but returns (0.3 s) when stop() comes: its thread ends within
    the wait, and NVML is shut down with its GPM samples freed — only a read still running
    after it keeps NVML up."""
    fake = SlowNvml([FakeDevice(), FakeDevice()], 0.3)
    s = GpuSampler(NvmlBackend(fake), lambda ev: None, interval_s=0.05)
    s.start()
    wait_for(lambda: s.rounds >= 3)
    assert s.stop(5.0)
    assert fake.initialised == 0 and fake.live_samples() == 0
    assert s.status == "stopped"


def test_a_gpu_not_answering_reads_n_a_not_its_last_figures() -> None:
    """As for a lost GPU, the readings of one not answering keep coming with every value
    None while its call is overdue — screens show n/a, not its last figures as if they
    were current; its late reading, when it comes, is stamped after those."""
    fake = HangingNvml([FakeDevice(name="A"), FakeDevice(name="B", util_gpu=55)], stuck=1)
    got: list[GpuReading] = []
    lock = threading.Lock()

    def publish(ev: Event) -> None:
        if isinstance(ev, GpuReading):
            with lock:
                got.append(ev)

    def of(index: int) -> list[GpuReading]:
        with lock:
            return [r for r in got if r.index == index]

    s = GpuSampler(NvmlBackend(fake), publish, interval_s=0.05)
    s.start()
    try:
        wait_for(lambda: s.rounds >= 2)
        fake.gate.clear()
        assert fake.hung.wait(5.0)
        wait_for(lambda: "GPU 1 not answering" in s.status)
        wait_for(lambda: {r.index: r for r in s.latest()}[1].util_gpu is None)
        latest = {r.index: r for r in s.latest()}
        assert latest[1].name == "B" and latest[1].mem_total_bytes is None
        blanks = [r for r in of(1) if r.util_gpu is None]
        assert blanks
        fake.gate.set()
        wait_for(lambda: of(1)[-1].util_gpu == 55.0)
        ts = [r.t for r in of(1)]
        assert ts == sorted(ts)
    finally:
        fake.gate.set()
        assert s.stop(5.0)
