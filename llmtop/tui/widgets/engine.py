"""The engine's own view (scraped from its /metrics): running, waiting, KV cache,
preemptions, and its TTFT p95 next to the one the proxy measured."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.base import ViewPanel, flow
from llmtop.tui.widgets.gpu import bar

STALE_AFTER_S = 5.0
"""A reading older than this (five of the default 1 s scrape intervals; three of the
snapshot's ``engine.interval_s`` when it says so, if that is longer) is stale: the engine
or its /metrics stopped answering, and its last figures are not what it is doing now."""


PREEMPT_RECENT_S = 60.0
"""The preemption count is shown in the alarm colour for this long (engine time) after it
last rose; before, any count above 0 was red for good: an engine that preempted once
yesterday read red all day (the GPU/engine helper's note)."""


def stale_after(view: SnapView) -> float:
    interval = view.num("engine", "interval_s")
    return STALE_AFTER_S if interval is None else max(STALE_AFTER_S, 3 * interval)


def one_line(parts: list[Text], sep: int = 2) -> int:
    """The cells ``parts`` take on one line, ``sep`` cells apart."""
    return sum(p.cell_len for p in parts) + sep * (len(parts) - 1)


class EnginePanel(ViewPanel):
    """Queue and KV cache (a line, or more when narrow, broken only between figures);
    then TTFT p95 engine vs proxy. A stale reading says how old it is, in the warning
    colour, and its figures turn dim."""

    READS = ("engine", "latency", "slo")

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._pre_seen: float | None = None
        self._pre_rose_at: float | None = None
        """The engine's reading time when its preemption count last rose."""

    def _preempt_style(self, count: float | None, at: float | None) -> str:
        """``bad`` while the count rose within :data:`PREEMPT_RECENT_S` of the reading's
        time, else plain (a count that fell: the engine restarted, no rise)."""
        if at is None:  # (a snapshot without the reading's time: any count, as before)
            return self.palette.bad if count else "bold"
        seen = self._pre_seen
        if count is not None and count != seen:
            if count > (seen or 0):  # (the first reading above 0: a rise, time unknown)
                self._pre_rose_at = at
            self._pre_seen = count
        rose = self._pre_rose_at
        recent = rose is not None and 0 <= at - rose <= PREEMPT_RECENT_S
        return self.palette.bad if count and recent else "bold"

    DEFAULT_CSS = """
    EnginePanel { height: auto; }
    """

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        eng = v.mapping("engine")
        head = Text()
        head.append("engine ", "bold")
        status = v.text("engine", "status")  # the scraper's line: why there is no reading
        if not eng or eng.get("kind") is None:
            why = printable(status) if status else "no engine metrics"
            head.append(f"n/a ({why})" if v.raw else fmt.NA, pal.dim)
            return head
        head.append(v.text("engine", "kind") or "unknown", pal.accent)
        age = v.num("engine", "age_s")
        stale = age is not None and age > stale_after(v)
        parts = [head]
        if stale:
            parts.append(Text(f"stale {fmt.duration(age)}", f"bold {pal.warn}"))
            if status and " engine at " not in status:  # why the scrapes fail now
                parts.append(Text(printable(status), pal.dim))

        def live(style: str) -> str:
            return pal.dim if stale else style

        def fig(label: str, value: str, style: str = "bold") -> None:
            part = Text(f"{label} ", pal.dim)
            part.append(value, live(style) if value != fmt.NA else pal.dim)
            parts.append(part)

        waiting = v.num("engine", "waiting")
        fig("running", fmt.count(v.num("engine", "running")))
        fig("waiting", fmt.count(waiting), pal.warn if waiting else "bold")
        kv = v.num("engine", "kv_cache_usage")
        kv_pct = None if kv is None else kv * 100
        kv_at = len(parts)
        kv_part = Text("KV ", pal.dim)
        kv_part.append(fmt.pct(kv, fraction=True), live(pal.usage(kv_pct)))
        parts.append(kv_part)
        pre = v.num("engine", "preemptions")
        fig("preempt", fmt.count(pre), self._preempt_style(pre, v.num("engine", "t")))
        with_bar = Text("KV ", pal.dim)
        with_bar.append_text(bar(kv, 8, live(pal.usage(kv_pct)), pal.dim))
        with_bar.append(" ")
        with_bar.append(fmt.pct(kv, fraction=True), live(pal.usage(kv_pct)))
        # The bar only where the line fits with it: a bar that pushed a figure to another
        # line would change the panel's height by the width (and a scrollbar's 2 columns
        # could then flip the layout back and forth).
        if one_line([*parts[:kv_at], with_bar, *parts[kv_at + 1:]]) <= width:
            parts[kv_at] = with_bar
        eng_ttft, proxy_ttft = v.num("engine", "ttft_p95"), v.num("latency", "ttft", "p95")
        slo = v.slo.ttft_s
        ttft = Text("TTFT p95 engine ", pal.dim)
        if eng_ttft is not None:  # read off the engine's histogram buckets: approximate
            ttft.append("≈", pal.dim)
        ttft.append(fmt.latency_against(eng_ttft, slo), live(pal.latency(eng_ttft, slo)))
        proxy = Text("· proxy ", pal.dim)
        proxy.append(fmt.latency_against(proxy_ttft, slo), pal.latency(proxy_ttft, slo))
        t = flow(parts, width)
        t.append("\n")
        t.append_text(flow([ttft, proxy], width, sep=" "))
        return t
