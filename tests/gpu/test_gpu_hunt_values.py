"""Values NVML hands back that cannot be what they claim: a percentage far outside 0–100
(a GPM window over counters that wrapped or went backwards, e.g. across a GPU reset;
NVML's 0xFFFFFFFF "not available" in a utilization field). The real NvmlBackend against
the injected FakeNvml."""

from __future__ import annotations

from llmtop.gpu.fake import FakeDevice, FakeNvml
from llmtop.gpu.nvml import NvmlBackend

NA = 0xFFFFFFFF


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def windows(dev: FakeDevice, n: int = 2) -> tuple[NvmlBackend, Clock]:
    """A backend over ``dev`` after ``n`` reads 250 ms apart; the clock at the next."""
    clock = Clock()
    fake = FakeNvml([dev], clock=clock)
    b = NvmlBackend(fake, monotonic=clock)
    b.init()
    for _ in range(n):
        b.read(0, clock.t)
        clock.t += 0.25
    return b, clock


def test_a_gpm_window_far_out_of_range_is_left_out_and_said() -> None:
    """1e12 % DRAM bandwidth, −50 % SM activity: n/a for that window (not a 1e12 % peak in
    the report, nor a bandwidth warning), the status says why, and the next sane window
    reads again."""
    dev = FakeDevice(dram_bw_util=1e12, sm_util=-50.0)
    b, clock = windows(dev)
    r = b.read(0, 0.0)
    assert (r.dram_bw_util, r.sm_activity) == (None, None)
    err = b.last_error(0)
    assert err is not None and "gpm" in err and "out of range" in err
    dev.dram_bw_util, dev.sm_util = 40.0, 60.0
    clock.t += 0.25
    r = b.read(0, 0.0)
    assert (r.dram_bw_util, r.sm_activity) == (40.0, 60.0)
    assert b.last_error(0) is None
    b.shutdown()


def test_rounding_over_100_percent_is_clamped() -> None:
    """A window that reads a hair over 100 % (two samples' timing) is 100 %, not n/a."""
    b, _ = windows(FakeDevice(dram_bw_util=100.4, sm_util=100.0))
    r = b.read(0, 0.0)
    assert (r.dram_bw_util, r.sm_activity) == (100.0, 100.0)
    assert b.last_error(0) is None
    b.shutdown()


def test_utilization_not_available_marker_is_none() -> None:
    """utilization.gpu / .memory of 0xFFFFFFFF: n/a, not 4294967295 %."""
    b, _ = windows(FakeDevice(util_gpu=NA, util_mem=NA), 1)
    r = b.read(0, 0.0)
    assert (r.util_gpu, r.mem_busy) == (None, None)
    assert r.mem_total_bytes is not None  # the rest of the reading stands
    b.shutdown()


def test_memory_used_past_total_is_no_reading() -> None:
    """Used memory past the total (a driver's unsigned count gone below zero reads
    2**64 - 1): n/a and said, not a 1.2e8 % memory bar — nor a recording line the reader
    refuses ("mem_used_bytes is an integer out of range")."""
    dev = FakeDevice(mem_used=2**64 - 1)
    b, _ = windows(dev, 1)
    r = b.read(0, 0.0)
    assert (r.mem_used_bytes, r.mem_total_bytes) == (None, None)
    err = b.last_error(0)
    assert err is not None and err.startswith("memory:") and "left out" in err
    assert r.power_w is not None  # the rest of the reading stands
    dev.mem_used = 20 * 2**30
    r = b.read(0, 0.0)
    assert r.mem_used_bytes == 20 * 2**30 and b.last_error(0) is None
    b.shutdown()


def test_a_lasting_gpm_error_stays_in_the_status() -> None:
    """nvmlGpmMetricsGet failing every time: each failure restarts the chain, and the read
    after it only primes it again, without error — the status said the error every other
    round (flickering between '1 GPU' and '1 GPU; GPU 0 gpm: Unknown Error') while the
    bandwidth read n/a throughout. Said every round now; gone once a window reads again."""
    import pynvml

    dev = FakeDevice(dram_bw_util=30.0)
    clock = Clock()
    fake = FakeNvml([dev], clock=clock)
    b = NvmlBackend(fake, monotonic=clock)
    b.init()
    b.read(0, 0.0)
    fake.fail(0, "nvmlGpmMetricsGet", pynvml.NVML_ERROR_UNKNOWN)
    errors = []
    for _ in range(6):
        clock.t += 0.25
        r = b.read(0, clock.t)
        assert r.dram_bw_util is None
        errors.append(b.last_error(0))
    assert all(e is not None and e.startswith("gpm:") for e in errors), errors
    fake.heal(0, "nvmlGpmMetricsGet")
    values = []
    for _ in range(3):
        clock.t += 0.25
        values.append((b.read(0, clock.t).dram_bw_util, b.last_error(0)))
    assert values[-1] == (30.0, None)
    b.shutdown()


def test_not_available_in_power_clocks_temperature_and_pcie_reads_n_a() -> None:
    """NVML's 0xFFFFFFFF in an unsigned field is "not available", not a 4.3 MW draw, a
    4.3e9 °C core or 4 TB/s over PCIe: each reads None, the rest of the device reads on,
    and a real value after it reads again."""
    dev = FakeDevice(power_mw=NA, power_limit_mw=NA, sm_clock=NA, mem_clock=NA,
                     temperature=NA, pcie_rx_kbs=NA, pcie_tx_kbs=NA)
    b, _ = windows(dev, n=0)
    r = b.read(0, 0.0)
    assert (r.power_w, r.power_limit_w, r.sm_clock_mhz, r.mem_clock_mhz, r.temperature_c,
            r.pcie_rx_bytes_s, r.pcie_tx_bytes_s) == (None,) * 7
    assert r.mem_used_bytes == dev.mem_used
    assert not b.lost(0)
    dev.power_mw, dev.power_limit_mw, dev.sm_clock, dev.temperature = 350_000, 700_000, 1980, 61
    dev.pcie_rx_kbs = 2
    r = b.read(0, 0.0)
    assert (r.power_w, r.power_limit_w, r.sm_clock_mhz, r.temperature_c) == (
        350.0, 700.0, 1980.0, 61.0)
    assert r.pcie_rx_bytes_s == 2048.0
    b.shutdown()
