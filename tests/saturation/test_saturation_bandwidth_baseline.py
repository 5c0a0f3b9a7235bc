"""BANDWIDTH holds through a memory-bound stretch longer than the baselines' horizon.

The chunk-gap baseline took every window's p50, slowed or not: after 5.5 minutes of
memory-bound decode (the horizon, 330 s at the default 10 s window) the history held only
the slowed p50s, the baseline became the slowdown itself and BANDWIDTH cleared while
nothing had changed — bandwidth at its peak, gaps twice the unloaded ones. The TTFT
baseline never had this: it learns only from calm windows.
"""

from __future__ import annotations

from test_saturation_bandwidth_window import traffic
from test_saturation_unit import Harness


def test_a_long_memory_bound_stretch_stays_raised_and_clears_when_it_ends() -> None:
    h = Harness()
    traffic(h, 30, gap=0.015, bw=85.0)  # unloaded: 15 ms gaps
    traffic(h, 20, gap=0.03, bw=92.0)
    assert h.codes() == ["BANDWIDTH"]
    traffic(h, 400, gap=0.03, bw=92.0)  # past the 330 s horizon, nothing changed
    assert h.codes("cleared") == [], [e.message for e in h.events]
    assert "ITL p50 rose 15 ms→30 ms" in h.updates("BANDWIDTH")[-1].message
    traffic(h, 40, gap=0.015, bw=85.0)  # the load goes: back to the unloaded gaps
    assert h.codes("cleared") == ["BANDWIDTH"]
