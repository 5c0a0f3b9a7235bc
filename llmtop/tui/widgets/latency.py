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


GIVE_WAY: tuple[str, ...] = ("SLO", *DROP_ORDER[:2], "n", *DROP_ORDER[2:])
"""The order the columns give way in when the panel is too narrow for every value whole:
the SLO column first (the cell colours say it too), then p90 and max, the sample count,
then p50 and p95."""


class LatencyPanel(ViewPanel):
    """The latency table. A row's SLO (when configured) is shown at narrow widths as the
    cell colours only, at wide widths also as its own column; narrower still, or with
    wider values (counts of ten million and more), whole columns are left out
    (:data:`GIVE_WAY`) rather than values cut."""

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
        values = {(key, p): fmt.latency_against(v.num("latency", key, p),
                                                slo.for_metric(key))
                  for key, _ in METRICS for p in PERCENTILES}
        if wide:
            for key, _ in METRICS:
                values[key, "n"] = fmt.count(v.num("latency", key, "count"))
                threshold = slo.for_metric(key)
                values[key, "SLO"] = "" if threshold is None else latency_text(threshold)
        shown = fitting_columns(values, width)
        table.add_column(Text("latency", style="bold"), no_wrap=True)
        for c in shown:
            table.add_column(c, justify="right", no_wrap=True,
                             style=pal.dim if c in EXTRA else "")
        for key, label in METRICS:
            threshold = slo.for_metric(key)
            cells: list[Text] = [Text(label)]
            for c in shown:
                style = "" if c in EXTRA else pal.latency(v.num("latency", key, c), threshold)
                cells.append(Text(values[key, c], style=style))
            table.add_row(*cells)
        return table


EXTRA: tuple[str, ...] = ("n", "SLO")
"""The columns after the percentiles (at wide widths)."""


def latency_text(s: float | None) -> str:
    """:func:`fmt.latency`, with the unit chosen after rounding: 9.996 ms is "10.0 ms" like
    its neighbours, not "10.00 ms" (and 99.96 ms "100 ms", 0.99996 s "1.00 s").
    (A local fix: fmt.py is being changed elsewhere; it belongs in fmt.latency.)"""
    text = fmt.latency(s)
    if s is None or text == fmt.NA:
        return text
    for shown, at in (("10.00 ms", 10e-3), ("100.0 ms", 100e-3), ("1000 ms", 1.0),
                      ("10.00 s", 10.0), ("100.0 s", 100.0), ("1000 µs", 1e-3)):
        if text.lstrip("-") == shown:
            return fmt.latency(at if s > 0 else -at)
    return text


def column_widths(values: dict[tuple[str, str], str]) -> dict[str, int]:
    """Each column's width over every row (and its heading); a percentile column is at
    least as wide as the widest value fmt.latency writes ("41.0 ms"), so that the
    columns shown do not come and go as the figures change."""
    cols = [c for c in (*PERCENTILES, *EXTRA) if any(k[1] == c for k in values)]
    return {c: max(LATENCY_W if c in PERCENTILES else len(c),
                   *(len(values[key, c]) for key, _ in METRICS if (key, c) in values))
            for c in cols}


def fitting_columns(values: dict[tuple[str, str], str], width: int) -> list[str]:
    """The columns (percentiles, then ``n`` and ``SLO`` when ``values`` has them) whose
    values all fit ``width`` whole, in table order: all of them when they fit, else the
    fewest left out in :data:`GIVE_WAY` order (p99 is always kept, even when nothing
    fits)."""
    label_w = max(len("latency"), *(len(label) for _, label in METRICS))
    col_w = column_widths(values)
    shown = list(col_w)
    for c in (None, *GIVE_WAY):
        if c is not None and c in shown:
            shown.remove(c)
        # each column after the label: a separator and one space of padding each side
        if label_w + sum(col_w[q] + 3 for q in shown) <= width:
            break
    return shown


def fitting_percentiles(values: dict[tuple[str, str], str], width: int) -> list[str]:
    """The percentile columns :func:`fitting_columns` keeps."""
    return [c for c in fitting_columns(values, width) if c in PERCENTILES]
