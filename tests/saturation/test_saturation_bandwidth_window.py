"""BANDWIDTH judges the GPU's bandwidth over the same window as the chunk gaps it compares.

Seen with ``llmtop sim --profile tiny`` behind ``llmtop run --headless`` and ``llmtop bench``
(concurrency 2 for 30 s, 16 for 30 s, then 1): the simulated GPU read 68 % DRAM bandwidth
at concurrency 2, 51–59 % while saturated (4 running, 12 queued: per-sequence compute, not
memory, set the step) and 80 % at concurrency 1. Six seconds after the load fell to one
stream, BANDWIDTH was raised — "DRAM bandwidth 80% while ITL p50 rose 15 ms→19 ms: decode
is memory-bound" — at the lowest load of the run: the 19 ms were the saturated stretch's
gaps, still in the window's finished requests, taken while the bandwidth was far below
the threshold; the 80 % was the last second's reading, with gaps of 12 ms. Judged over
the same window, neither half of the evidence held at once.
"""

from __future__ import annotations

from test_saturation_unit import Harness, record

from llmtop.events import GpuReading


def gpu(h: Harness, bw: float) -> GpuReading:
    return GpuReading(t=h.now, index=0, name="g", mem_used_bytes=1, mem_total_bytes=100,
                      dram_bw_util=bw)


def traffic(h: Harness, seconds: int, *, gap: float, bw: float) -> None:
    """``seconds`` of answers with chunk gaps of ``gap``, and a GPU reading each second."""
    for _ in range(seconds):
        h.feed(gpu(h, bw), *[record(h.now - 1.0, gap=gap) for _ in range(5)])
        h.step()


def test_gaps_of_a_stretch_with_low_bandwidth_do_not_meet_a_later_high_reading() -> None:
    h = Harness()
    traffic(h, 30, gap=0.015, bw=68.0)  # the baseline: 15 ms gaps
    traffic(h, 30, gap=0.02, bw=55.0)  # saturated by compute: slower, bandwidth low
    assert "BANDWIDTH" not in h.codes(), "low bandwidth: not memory-bound"
    # one stream: the bandwidth reads 80 %, its gaps are 12 ms; the last 10 s still
    # hold the saturated stretch's answers for a while
    for i in range(30):
        h.feed(gpu(h, 81.0), *[record(h.now - 1.0, gap=0.012) for _ in range(5 if i < 8 else 1)])
        h.step()
    assert "BANDWIDTH" not in h.codes(), [e.message for e in h.updates("BANDWIDTH")]


def test_bandwidth_held_high_through_rising_gaps_still_raises() -> None:
    h = Harness()
    traffic(h, 30, gap=0.015, bw=85.0)
    assert "BANDWIDTH" not in h.codes()
    traffic(h, 12, gap=0.03, bw=92.0)
    assert "BANDWIDTH" in h.codes()
    msg = h.updates("BANDWIDTH")[0].message
    assert "DRAM bandwidth" in msg and "ITL p50 rose" in msg
