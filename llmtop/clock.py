"""llmtop's one clock: unix seconds on a monotonic timeline.

Every instant llmtop stamps (request starts, interval boundaries, GPU and engine readings,
warnings, a recording's ``started_at``/``ended_at``) comes from :func:`unix_now`: a wall
clock reading taken **once** (the *anchor*) plus the ``time.perf_counter_ns`` time elapsed
since. The result is unix seconds, as ``shared/docs/interfaces.md`` promises, but it never
jumps: an NTP step or a manual ``date -s`` moves ``time.time()`` and not llmtop's clock, so
a 10 s window keeps holding 10 s of traffic and an interval never runs backwards. The price
is that after a step llmtop's times differ from the system clock by the step — the same
instants, measured on the timeline llmtop started with.

The anchor is never moved silently. :func:`set_anchor` (a worker of ``--workers N`` taking
the coordinator's anchor, tests) is the only way.

``--workers N``: the coordinator passes its anchor to each worker in the environment
(:data:`ENV`, :func:`child_env`); a worker adopts it at import, so every process's records
are on the coordinator's timeline. ``perf_counter_ns`` is ``CLOCK_MONOTONIC`` on Linux
(``mach_absolute_time`` on macOS): one clock for the whole machine, so the anchor means
the same in every process. A worker that finds an anchor from the future (another
machine's, a corrupt value) ignores it and takes its own.

The proxy stamps with ``perf_counter_ns`` (:func:`unix_at_ns` turns such a stamp into unix
seconds, exactly and without another clock read).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Final

ENV: Final = "LLMTOP_CLOCK_ANCHOR"
"""The environment variable a worker process reads its anchor from (``WALL:PERF_NS``)."""


@dataclass(frozen=True, slots=True)
class Anchor:
    """``wall`` (unix seconds) was the time when ``perf_counter_ns()`` read ``perf_ns``."""

    wall: float
    perf_ns: int

    def encode(self) -> str:
        return f"{self.wall!r}:{self.perf_ns}"

    @staticmethod
    def decode(text: str) -> Anchor | None:
        """The anchor ``text`` encodes; ``None`` when it is malformed."""
        wall_s, sep, perf_s = text.strip().partition(":")
        if not sep:
            return None
        try:
            wall, perf_ns = float(wall_s), int(perf_s)
        except ValueError:
            return None
        if not (wall == wall and 0.0 < wall < 1e11) or perf_ns < 0:  # NaN, absurd
            return None
        return Anchor(wall, perf_ns)


def take_anchor(
    wall: Callable[[], float] = time.time, perf_ns: Callable[[], int] = time.perf_counter_ns
) -> Anchor:
    """A fresh anchor: the wall clock read between two ``perf_counter_ns`` reads."""
    p0 = perf_ns()
    w = wall()
    p1 = perf_ns()
    return Anchor(w, (p0 + p1) // 2)


def initial_anchor(env: MutableMapping[str, str]) -> Anchor:
    """The anchor a process starts with: the one :data:`ENV` names (taken out of ``env``,
    so it is not handed further down) when it is valid and not from the future, else a
    fresh one."""
    given = env.pop(ENV, "")
    if given:
        a = Anchor.decode(given)
        if a is not None and a.perf_ns <= time.perf_counter_ns():
            return a
    return take_anchor()


_anchor: Anchor = initial_anchor(os.environ)


def unix_now() -> float:
    """Now, in unix seconds on llmtop's monotonic timeline."""
    a = _anchor
    return a.wall + (time.perf_counter_ns() - a.perf_ns) / 1e9


def unix_at_ns(t_ns: int) -> float:
    """The unix seconds (llmtop's timeline) of a ``time.perf_counter_ns()`` reading."""
    a = _anchor
    return a.wall + (t_ns - a.perf_ns) / 1e9


def anchor() -> Anchor:
    """The anchor in use."""
    return _anchor


def set_anchor(a: Anchor) -> Anchor:
    """Use ``a`` from now on; returns the previous anchor (to restore it)."""
    global _anchor
    old, _anchor = _anchor, a
    return old


def child_env() -> dict[str, str]:
    """What a child llmtop process needs in its environment to share this timeline."""
    return {ENV: _anchor.encode()}
