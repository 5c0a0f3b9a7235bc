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
DROP_ORDER: tuple[str, ...] = ("p90", "max", "p50", "p95")
"""Which percentile columns give way first when the panel is too narrow for whole values
(a cut "2.9…" reads as a different number): p99 stays to the last."""
LATENCY_W = len("41.0 ms")
"""The widest value :func:`fmt.latency` writes below 100 s."""


class LatencyPanel(ViewPanel):
    """The latency table. A row's SLO (when configured) is shown at narrow widths as the
    cell colours only, at wide widths also as its own column; narrower still, whole
    percentile columns are left out (:data:`DROP_ORDER`) rather than values cut."""

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
        values = {(key, p): fmt.latency(v.num("latency", key, p))
                  for key, _ in METRICS for p in PERCENTILES}
        shown = fitting_percentiles(values, width)
        table.add_column(Text("latency", style="bold"), no_wrap=True)
        for p in shown:
            table.add_column(p, justify="right", no_wrap=True)
        if wide:
            table.add_column("n", justify="right", no_wrap=True, style=pal.dim)
            table.add_column("SLO", justify="right", no_wrap=True, style=pal.dim)
        for key, label in METRICS:
            threshold = slo.for_metric(key)
            cells: list[Text] = [Text(label)]
            for p in shown:
                val = v.num("latency", key, p)
                cells.append(Text(values[key, p], style=pal.latency(val, threshold)))
            if wide:
                cells.append(Text(fmt.count(v.num("latency", key, "count"))))
                cells.append(Text("" if threshold is None else fmt.latency(threshold)))
            table.add_row(*cells)
        return table


def fitting_percentiles(values: dict[tuple[str, str], str], width: int) -> list[str]:
    """The percentile columns whose values fit ``width`` whole, in table order: all of
    them when they fit, else the fewest dropped in :data:`DROP_ORDER` (p99 is always
    kept, even when nothing fits)."""
    label_w = max(len("latency"), *(len(label) for _, label in METRICS))
    # as wide as the widest value fmt.latency writes ("41.0 ms"), so that the columns shown
    # do not come and go as the figures change
    col_w = {p: max(LATENCY_W, *(len(values[key, p]) for key, _ in METRICS))
             for p in PERCENTILES}
    shown = list(PERCENTILES)
    for p in (None, *DROP_ORDER):
        if p is not None:
            shown.remove(p)
        # each column after the label: a separator and one space of padding each side
        if label_w + sum(col_w[q] + 3 for q in shown) <= width:
            break
    return shown
