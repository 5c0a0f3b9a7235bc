"""Preemptions in a window count the engine counter's rises, reading to reading: an
engine restart inside the window resets the counter, and last − first read 0 (or less)
however many preemptions there were — KV_CACHE's evidence vanished with a restart."""

from __future__ import annotations

from llmtop.config import load_config
from llmtop.events import EngineReading
from llmtop.saturation.signals import Signals

T0 = 1_800_000_000.0


def _signals(counts: list[float]) -> Signals:
    sig = Signals(load_config(None, env={}).slo, keep_s=30, tally_s=60, slice_s=1,
                  horizon_s=330, engine_fresh_s=2)
    sig.on_events([EngineReading(t=T0 + i, kind="vllm", preemptions=c)
                   for i, c in enumerate(counts)])
    return sig


def test_a_counter_reset_inside_the_window_keeps_what_came_before_and_after() -> None:
    # 100 → 130 (30), restart to 0, then 0 → 12 (12): 42 preemptions in the window
    sig = _signals([100, 110, 130, 0, 5, 12])
    assert sig.preemptions_delta(T0 + 6, 10) == 42


def test_a_steady_counter_is_last_minus_first() -> None:
    assert _signals([7, 9, 9, 15]).preemptions_delta(T0 + 4, 10) == 8
    assert _signals([7, 7]).preemptions_delta(T0 + 2, 10) == 0
