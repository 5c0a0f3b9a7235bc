"""A small block chart (eighth-block columns, newest on the right) with an optional
threshold line, rendered to a Rich ``Text``. Pure and deterministic, so it is tested on
its own; ``widgets/plots.py`` sizes it to the panel."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

BLOCKS = " ▁▂▃▄▅▆▇█"
LINE = "╌"


@dataclass(frozen=True, slots=True)
class ChartStyle:
    """Rich styles: bars at or under the threshold, bars over it, and the threshold line."""

    bar: str = "green"
    over: str = "red"
    line: str = "yellow"


def chart_top(values: Sequence[float | None], threshold: float | None) -> float:
    """The value at the top of the chart: the series' maximum, with head-room for the line."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = max(finite, default=0.0)
    if threshold is not None and threshold > 0:
        top = max(top, threshold * 1.25)
    return top if top > 0 else 1.0


def resample(values: Sequence[float | None], width: int) -> list[float | None]:
    """At most ``width`` columns: consecutive values are bucketed and each bucket keeps its
    maximum (a latency spike must not be averaged away). ``None`` only for empty buckets."""
    vals = list(values)
    n = len(vals)
    if n <= width:
        return vals
    out: list[float | None] = []
    for b in range(width):
        lo, hi = b * n // width, (b + 1) * n // width
        finite = [v for v in vals[lo:hi] if v is not None and math.isfinite(v)]
        out.append(max(finite) if finite else None)
    return out


def render_chart(
    values: Sequence[float | None],
    width: int,
    height: int,
    threshold: float | None = None,
    style: ChartStyle | None = None,
) -> Text:
    """``height`` lines of ``width`` cells. The last ``width`` values are drawn, right-aligned;
    ``None`` leaves a gap. Bars above ``threshold`` take ``style.over``; the threshold is a
    dashed line in the row that contains it."""
    style = style or ChartStyle()
    width, height = max(0, width), max(0, height)
    out = Text(no_wrap=True, overflow="crop")
    if width == 0 or height == 0:
        return out
    vals = resample(values, width)
    vals = [*([None] * (width - len(vals))), *vals]
    top = chart_top(vals, threshold)
    eighths = height * 8
    levels = [
        0 if v is None or not math.isfinite(v) else max(0, min(eighths, round(v / top * eighths)))
        for v in vals
    ]
    # A non-zero value never vanishes: it gets at least the lowest block.
    levels = [
        1 if lvl == 0 and v is not None and math.isfinite(v) and v > 0 else lvl
        for lvl, v in zip(levels, vals, strict=True)
    ]
    line_row: int | None = None
    if threshold is not None and threshold > 0:
        line_row = min(height - 1, int(threshold / top * height))
    for row in range(height - 1, -1, -1):
        run, run_style = "", ""
        for v, lvl in zip(vals, levels, strict=True):
            cell = max(0, min(8, lvl - row * 8))
            if cell > 0:
                over = threshold is not None and v is not None and v > threshold
                ch, st = BLOCKS[cell], style.over if over else style.bar
            elif row == line_row:
                ch, st = LINE, style.line
            else:
                ch, st = " ", ""
            if st != run_style and run:
                out.append(run, run_style)
                run = ""
            run, run_style = run + ch, st
        if run:
            out.append(run, run_style)
        if row:
            out.append("\n")
    return out
