"""The TTFT baseline (what QUEUEING compares against) is a calm window's TTFT p95 over at
least five streamed answers: non-streamed answers have no first token, so they must not
make up the five (a window of four non-streamed answers and one streamed one gave a
"p95" of that one request's TTFT)."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import T0, record

from llmtop.events import RequestRecord
from llmtop.saturation.signals import Signals


def _whole(t_start: float) -> RequestRecord:
    """A non-streamed answer: one body, its TTFT its E2E (what the relay records)."""
    r = record(t_start, ttft=0.8, n=1)
    return dataclasses.replace(r, stream=False, ttft_s=0.8, e2e_s=0.8,
                               chunk_offsets_s=(0.8,), id=f"whole{t_start}")


def test_non_streamed_answers_do_not_count_towards_the_five() -> None:
    sig = Signals()
    now = T0 + 10.0
    # four non-streamed answers and one streamed answer (TTFT 30 ms) in the window
    sig.on_events([_whole(T0 + i) for i in range(4)])
    sig.on_events([record(T0 + 5.0, ttft=0.03)])
    sig.remember_baselines(now, 10.0, calm=True)
    assert len(sig.ttft_p95_history) == 0  # nothing learned
    assert sig.ttft_baseline() is None


def test_five_streamed_answers_among_non_streamed_ones_set_it() -> None:
    sig = Signals()
    now = T0 + 10.0
    sig.on_events([_whole(T0 + i) for i in range(4)])
    sig.on_events([record(T0 + 5.0 + i * 0.1, ttft=0.03 + 0.01 * i) for i in range(5)])
    sig.remember_baselines(now, 10.0, calm=True)
    base = sig.ttft_baseline()
    assert base is not None
    assert abs(base - 0.068) < 1e-9  # numpy's p95 of 30..70 ms
