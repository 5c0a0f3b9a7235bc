"""The saturation warnings bar: code, how long it has been raised, and its message
(which names the evidence and the remedy). Times are relative to the snapshot's clock."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num, as_str
from llmtop.tui.widgets.base import ViewPanel

ICONS = {"critical": "✖", "warning": "▲", "info": "●"}


def severity_style(severity: str, pal: Palette) -> str:
    return {"critical": f"bold {pal.bad}", "warning": f"bold {pal.warn}"}.get(
        severity, pal.accent
    )


class WarningsBar(ViewPanel):
    """One line per warning, most severe first; a single "no warnings" line otherwise."""

    READS = ("warnings", "time")

    def layout_key(self, view: SnapView) -> object:
        return len(view.items("warnings"))

    DEFAULT_CSS = """
    WarningsBar { height: auto; max-height: 6; padding: 0 1; }
    """

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        warnings = v.items("warnings")
        t = Text(no_wrap=True, overflow="ellipsis")
        if not warnings:
            t.append("✓ no saturation warnings", pal.ok)
            return t
        order = {"critical": 0, "warning": 1, "info": 2}
        now = v.time
        rows = sorted(warnings, key=lambda w: order.get(as_str(w.get("severity")) or "", 3))
        for i, w in enumerate(rows):
            if i:
                t.append("\n")
            sev = as_str(w.get("severity")) or "warning"
            style = severity_style(sev, pal)
            t.append(f"{ICONS.get(sev, '▲')} ", style)
            t.append(as_str(w.get("code")) or "WARNING", style)
            since = as_num(w.get("since"))
            if since is not None and now is not None:
                t.append(f" {fmt.duration(max(0.0, now - since))}", pal.dim)
            t.append("  ")
            t.append(as_str(w.get("message")) or "")
        return t
