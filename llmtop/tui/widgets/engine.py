"""The engine's own view (scraped from its /metrics): running, waiting, KV cache,
preemptions, and its TTFT p95 next to the one the proxy measured."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.widgets.base import ViewPanel
from llmtop.tui.widgets.gpu import bar


class EnginePanel(ViewPanel):
    """One or two lines: queue and KV cache; then TTFT p95 engine vs proxy."""

    READS = ("engine", "latency", "slo")

    DEFAULT_CSS = """
    EnginePanel { height: auto; }
    """

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        eng = v.mapping("engine")
        t = Text(no_wrap=False)
        t.append("engine ", "bold")
        if not eng:
            t.append("n/a (no engine metrics)", pal.dim)
            return t
        t.append(v.text("engine", "kind") or "unknown", pal.accent)

        def fig(label: str, value: str, style: str = "bold") -> None:
            t.append(f"  {label} ", pal.dim)
            t.append(value, style if value != fmt.NA else pal.dim)

        waiting = v.num("engine", "waiting")
        fig("running", fmt.count(v.num("engine", "running")))
        fig("waiting", fmt.count(waiting), pal.warn if waiting else "bold")
        kv = v.num("engine", "kv_cache_usage")
        kv_pct = None if kv is None else kv * 100
        t.append("  KV ", pal.dim)
        if width >= 60:
            t.append_text(bar(kv, 8, pal.usage(kv_pct), pal.dim))
            t.append(" ")
        t.append(fmt.pct(kv, fraction=True), pal.usage(kv_pct))
        pre = v.num("engine", "preemptions")
        fig("preempt", fmt.count(pre), pal.bad if pre else "bold")
        t.append("\n")
        eng_ttft, proxy_ttft = v.num("engine", "ttft_p95"), v.num("latency", "ttft", "p95")
        slo = v.slo.ttft_s
        t.append("TTFT p95 ", pal.dim)
        t.append("engine ", pal.dim)
        t.append(fmt.latency(eng_ttft), pal.latency(eng_ttft, slo))
        t.append(" · proxy ", pal.dim)
        t.append(fmt.latency(proxy_ttft), pal.latency(proxy_ttft, slo))
        return t
