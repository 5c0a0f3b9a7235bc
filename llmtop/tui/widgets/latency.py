"""TTFT, ITL, chunk gap, TPOT and E2E × p50/p90/p95/p99/max, coloured against the SLOs."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.base import ViewPanel

METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "TTFT"),
    ("itl", "ITL"),
    ("chunk_gap", "chunk gap"),
    ("tpot", "TPOT"),
    ("e2e", "E2E"),
)
PERCENTILES: tuple[str, ...] = ("p50", "p90", "p95", "p99", "max")


class LatencyPanel(ViewPanel):
    """The latency table. A row's SLO (when configured) is shown at narrow widths as the
    cell colours only, at wide widths also as its own column."""

    READS = ("latency", "slo")

    def layout_key(self, view: SnapView) -> object:
        return None  # always the same number of lines

    DEFAULT_CSS = """
    LatencyPanel { height: auto; }
    """

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        slo = v.slo
        wide = width >= 76
        table = Table(
            box=box.SIMPLE_HEAD,
            expand=False,
            pad_edge=False,
            padding=(0, 1),
            show_edge=False,
            header_style="bold",
        )
        table.add_column(Text("latency", style="bold"), no_wrap=True)
        for p in PERCENTILES:
            table.add_column(p, justify="right", no_wrap=True)
        if wide:
            table.add_column("n", justify="right", no_wrap=True, style=pal.dim)
            table.add_column("SLO", justify="right", no_wrap=True, style=pal.dim)
        for key, label in METRICS:
            threshold = slo.for_metric(key)
            cells: list[Text] = [Text(label)]
            for p in PERCENTILES:
                val = v.num("latency", key, p)
                cells.append(Text(fmt.latency(val), style=pal.latency(val, threshold)))
            if wide:
                cells.append(Text(fmt.count(v.num("latency", key, "count"))))
                cells.append(Text("" if threshold is None else fmt.latency(threshold)))
            table.add_row(*cells)
        return table
