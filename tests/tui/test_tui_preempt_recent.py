"""The engine line showed the engine's preemption count in the alarm colour whenever it
was above 0: it is a counter since the engine started, so one preemption yesterday read
red all day (the GPU/engine helper's note). The count is now red for a minute (engine
time) after it last rose, plain otherwise."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.engine import PREEMPT_RECENT_S, EnginePanel


def preempt_style(panel: EnginePanel, count: int, t: float) -> str:
    snap: dict[str, Any] = {"engine": {"kind": "vllm", "running": 1, "waiting": 0,
                                       "kv_cache_usage": 0.5, "preemptions": count,
                                       "t": t, "age_s": 0.5}}
    panel.view = SnapView(snap)  # (what show() stores, without an app to refresh)
    text = panel.build(200)
    assert isinstance(text, Text)
    at = text.plain.index("preempt ") + len("preempt ")
    styles = {str(s.style) for s in text.spans if s.start <= at < s.end}
    return "red" if "red" in styles else "plain"


def test_the_count_is_red_only_while_it_rose_recently() -> None:
    panel = EnginePanel()
    panel.palette = Palette()
    t0 = 1_796_000_000.0
    assert preempt_style(panel, 0, t0) == "plain"
    assert preempt_style(panel, 3, t0 + 1) == "red"  # rose
    assert preempt_style(panel, 3, t0 + 30) == "red"  # within the minute
    assert preempt_style(panel, 3, t0 + 2 + PREEMPT_RECENT_S) == "plain"  # a minute on
    assert preempt_style(panel, 4, t0 + 100) == "red"  # rose again
    assert preempt_style(panel, 0, t0 + 110) == "plain"  # the engine restarted: no rise
    assert preempt_style(panel, 0, t0 + 111) == "plain"
