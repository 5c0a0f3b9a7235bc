"""Periodic wake-ups on one shared grid, so that an event loop's timers fire together.

Each wake-up of a sleeping event loop costs CPU whatever it then does (on the 2-core VM
this project is measured on: ~150-260 µs of run time per wake-up of the observers'
thread, most of it the kernel's and the loop's, not the work). The observers' loop runs
several periodic tasks — the bus pump (4 Hz), the metrics tick (2 Hz), the engine
scraper (1 Hz by default) — and each slept its own interval from whenever it last woke,
so their wake-ups drifted apart: an idle proxy's observers woke ~9.4 times a second for
7 timers' worth of work, two of them often 1-3 ms apart. Sleeping to the next multiple of
the period on the loop's clock instead puts the timers of every task whose period divides
another's on the same instants, and the loop runs them in one wake-up.
"""

from __future__ import annotations

import math


def grid_delay(now: float, period_s: float) -> float:
    """Seconds from ``now`` (the loop's ``time()``) to the next multiple of ``period_s``
    — in ``(0, period_s]``, never a near-zero wait at a point that was just reached (a
    loop whose clock does not move between two reads would otherwise spin on it)."""
    k = math.floor(now / period_s + 1e-6) + 1
    return k * period_s - now
