"""The saturation warnings bar: code, how long it has been raised, and its message
(which names the evidence and the remedy). Times are relative to the snapshot's clock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num, as_str
from llmtop.tui.widgets.base import ViewPanel

ICONS = {"critical": "✖", "warning": "▲", "info": "●"}


def severity_style(severity: str, pal: Palette) -> str:
    return {"critical": f"bold {pal.bad}", "warning": f"bold {pal.warn}"}.get(
        severity, pal.accent
    )


MAX_LINES = 6
SHORT_LINES = 2
"""Lines the bar may take (on a short terminal: ``SHORT_LINES``). With more warnings
than lines, the last line names the codes that did not get a line of their own."""


class WarningsBar(ViewPanel):
    """One line per warning, most severe first, each cut with "…" to the width; a single
    "no warnings" line otherwise."""

    READS = ("warnings", "time")

    def layout_key(self, view: SnapView) -> object:
        return len(view.items("warnings"))

    DEFAULT_CSS = """
    WarningsBar { height: auto; padding: 0 1; }
    """

    def max_lines(self) -> int:
        try:
            short = self.screen.has_class("-short")
        except Exception:  # not on a screen yet
            short = False
        return SHORT_LINES if short else MAX_LINES

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        warnings = v.items("warnings")
        t = Text(no_wrap=True, overflow="ellipsis")
        if not v.raw:  # nothing is known yet: not "no warnings"
            t.append("warnings n/a (no snapshot yet)", pal.dim)
            return t
        if not warnings:
            t.append("✓ no saturation warnings", pal.ok)
            return t
        order = {"critical": 0, "warning": 1, "info": 2}
        rows = sorted(warnings, key=lambda w: order.get(as_str(w.get("severity")) or "", 3))
        limit = max(1, self.max_lines())
        shown, rest = (rows, []) if len(rows) <= limit else (rows[: limit - 1], rows[limit - 1:])
        for i, w in enumerate(shown):
            if i:
                t.append("\n")
            self._line(t, w)
        if rest:
            if shown:
                t.append("\n")
            sev = as_str(rest[0].get("severity")) or "warning"
            t.append(f"{ICONS.get(sev, '▲')} +{len(rest)} more: ", severity_style(sev, pal))
            for i, w in enumerate(rest):
                if i:
                    t.append(", ", pal.dim)
                t.append(printable(as_str(w.get("code")) or "WARNING"),
                         severity_style(as_str(w.get("severity")) or "warning", pal))
        return t

    def _line(self, t: Text, w: Mapping[str, Any]) -> None:
        pal, now = self.palette, self.view.time
        sev = as_str(w.get("severity")) or "warning"
        style = severity_style(sev, pal)
        t.append(f"{ICONS.get(sev, '▲')} ", style)
        t.append(printable(as_str(w.get("code")) or "WARNING"), style)
        since = as_num(w.get("since"))
        if since is not None and now is not None:
            t.append(f" {fmt.duration(max(0.0, now - since))}", pal.dim)
        t.append("  ")
        t.append(printable(as_str(w.get("message")) or ""))  # attach's: another proxy's error
