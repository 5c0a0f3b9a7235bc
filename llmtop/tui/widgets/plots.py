"""Time plots over the last minutes: system output TPS, TTFT p95, ITL p95 and in-flight,
each with its reference line (goodput at SLO, the TTFT and ITL SLOs, capacity at SLO).

Points come from the snapshot's ``series``; a source without one gets a history the panel
builds itself from successive snapshots."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.chart import ChartStyle, render_chart
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num
from llmtop.tui.widgets.base import ViewPanel

HISTORY = 600


@dataclass(frozen=True, slots=True)
class PlotSpec:
    key: str
    title: str
    unit: Callable[[float | None], str]
    reference: Callable[[SnapView], float | None]
    reference_label: str
    short_label: str = ""
    """``reference_label`` for a narrow chart (defaults to it)."""
    over_is_bad: bool = True
    """Colour values above the reference line as bad (latency, in-flight over capacity);
    not for throughput, where more is better."""
    short_title: str = ""
    """``title`` for a chart too narrow for it beside both figures (defaults to it)."""


def _count(x: float | None) -> str:
    return fmt.count(x)


def _at_capacity(key: str) -> Callable[[SnapView], float | None]:
    """The capacity section's ``key`` — none when no concurrency meets the SLOs (a line
    at 0 is no limit worth drawing; the capacity line says why)."""

    def ref(v: SnapView) -> float | None:
        if v.num("capacity", "max_concurrency_at_slo") == 0:
            return None
        return v.num("capacity", key)

    return ref


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        # not plain "goodput": the header's goodput is the window's, this one capacity's
        "output_tps", "output tok/s", fmt.rate, _at_capacity("goodput_tps_at_slo"),
        "goodput at capacity", "capacity", over_is_bad=False, short_title="out tok/s",
    ),
    PlotSpec("ttft_p95", "TTFT p95", fmt.latency, lambda v: v.slo.ttft_s, "SLO"),
    PlotSpec("itl_p95", "ITL p95", fmt.latency, lambda v: v.slo.itl_p95_s, "SLO"),
    PlotSpec(
        "in_flight", "in flight", _count, _at_capacity("max_concurrency_at_slo"),
        "capacity",
    ),
)


def title_parts(spec: PlotSpec, value: str, ref: str | None, width: int) -> tuple[str, str]:
    """A chart title's words and reference legend for ``width`` cells, both figures
    whole where they can be: the words give way first (the reference's label, then the
    title's own), the figures last; what still does not fit is cut at the end."""
    short_label = spec.short_label or spec.reference_label
    short_title = spec.short_title or spec.title
    if ref is None:
        candidates = [(spec.title, ""), (short_title, "")]
    else:
        candidates = [
            (spec.title, f"  ╌ {spec.reference_label} {ref}"),
            (spec.title, f"  ╌ {short_label} {ref}"),
            (short_title, f"  ╌ {short_label} {ref}"),
            (short_title, f"  ╌ {ref}"),
            (short_title, f" ╌ {ref}"),
        ]
    for words, legend in candidates:
        if cell_len(words) + 1 + cell_len(value) + cell_len(legend) <= width:
            return words, legend
    return candidates[-1]


def figure_age(points: Sequence[Mapping[str, Any]], at: int | None) -> float | None:
    """How much older point ``at`` (the newest with a figure) is than the newest point,
    in seconds; ``None`` when it is the newest (or times are missing). A latency chart has
    no figure for an interval in which no request finished: its title then shows the last
    figure there was — with its age, not as the latest interval's (QA: "TTFT p95 4.21 s"
    stood for two minutes after the traffic had stopped)."""
    if at is None or at >= len(points) - 1:
        return None
    then, now = as_num(points[at].get("t")), as_num(points[-1].get("t"))
    if then is None or now is None or now <= then:
        return None
    return now - then


class SeriesHistory:
    """Points remembered from successive snapshots, for sources that send no ``series``."""

    def __init__(self, maxlen: int = HISTORY) -> None:
        self.points: deque[dict[str, float | None]] = deque(maxlen=maxlen)
        self._last_t: float | None = None

    def add(self, v: SnapView) -> None:
        t = v.time
        if t is not None and t == self._last_t:
            return
        self._last_t = t
        self.points.append(
            {
                "t": t,
                "output_tps": v.num("system", "output_tps"),
                "rps": v.num("system", "rps"),
                "in_flight": v.num("system", "in_flight"),
                "waiting": v.num("system", "waiting"),
                "ttft_p95": v.num("latency", "ttft", "p95"),
                "itl_p95": v.num("latency", "itl", "p95"),
            }
        )


def series_values(points: Sequence[Mapping[str, Any]], key: str) -> list[float | None]:
    return [as_num(p.get(key)) for p in points]


class PlotsPanel(ViewPanel):
    """Four charts in a 2×2 grid (one column when narrow)."""

    READS = ("series", "slo", "capacity", "system", "latency", "time")

    def layout_key(self, view: SnapView) -> object:
        return None  # always the same number of lines

    DEFAULT_CSS = """
    PlotsPanel { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.history = SeriesHistory()

    def points(self) -> list[Mapping[str, Any]]:
        series = self.view.items("series")
        if series:
            return series
        return list(self.history.points)

    def show(self, view: SnapView, palette: Palette) -> None:
        if not view.items("series"):
            self.history.add(view)
        super().show(view, palette)
        self.border_title = self.caption()

    def caption(self) -> str:
        """The panel's title: how long the charts span and what their figures are. From
        the snapshot's ``series`` each chart's figure is its latest point's (the last
        2 s), not the window's: beside the header's and the latency panel's figures
        over 60 s ("167 tok/s", "p95 1.31 s") an unlabelled "output tok/s 201", "TTFT
        p95 1.64 s" read as the same figures disagreeing."""
        ts = [t for t in (as_num(p.get("t")) for p in self.view.items("series"))
              if t is not None]
        steps = [b - a for a, b in pairwise(ts) if b > a]
        if not steps:
            return "last minutes"
        step = min(steps)
        span = ts[-1] - ts[0] + step
        return f"last {fmt.duration(span)} · figures: latest {fmt.duration(step)}"

    def _chart(self, spec: PlotSpec, width: int, height: int) -> list[Text]:
        v, pal = self.view, self.palette
        points = self.points()
        values = series_values(points, spec.key)
        ref = spec.reference(v)
        at = next((i for i in range(len(values) - 1, -1, -1) if values[i] is not None), None)
        last = None if at is None else values[at]
        finite = [x for x in values if x is not None]
        over = spec.over_is_bad and ref is not None and last is not None and last > ref
        value = spec.unit(last)
        age = figure_age(points, at)
        aged = f" ({fmt.duration(age)} ago)" if age is not None else ""
        words, legend = title_parts(spec, value + aged,
                                    None if ref is None else spec.unit(ref), width)
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(words, "bold")
        title.append(" ")
        title.append(value, pal.bad if over else pal.accent)
        title.append(aged, pal.dim)
        title.append(legend, pal.warn)
        peak = f"  max {spec.unit(max(finite))}" if finite else ""
        if peak and title.cell_len + len(peak) <= width:
            title.append(peak, pal.dim)
        title.truncate(width, overflow="ellipsis")
        lines = [title]
        if height > 1:
            if not finite:
                body = Text("no data yet", style=pal.dim)
                lines.append(body)
                lines.extend(Text("") for _ in range(height - 2))
            else:
                over_style = pal.bad if spec.over_is_bad else pal.accent
                style = ChartStyle(bar=pal.accent if not spec.over_is_bad else pal.ok,
                                   over=over_style, line=pal.warn)
                chart = render_chart(values, width, height - 1, ref, style)
                lines.extend(chart.split("\n"))
        return lines[:height]

    def build(self, width: int) -> RenderableType:
        height = max(2, self.content_region.height or self.size.height)
        cols = 2 if width >= 60 else 1
        rows = (len(PLOTS) + cols - 1) // cols
        cell_h = max(2, height // rows)
        gap = 2 if cols == 2 else 0
        cell_w = max(1, (width - gap * (cols - 1)) // cols)
        out = Text(no_wrap=True, overflow="crop")
        for r in range(rows):
            charts = [
                self._chart(PLOTS[r * cols + c], cell_w, cell_h)
                for c in range(cols)
                if r * cols + c < len(PLOTS)
            ]
            for i in range(cell_h):
                for c, lines in enumerate(charts):
                    if c:
                        out.append(" " * gap)
                    line = lines[i] if i < len(lines) else Text("")
                    line = line.copy()
                    line.pad_right(cell_w - line.cell_len)
                    out.append_text(line)
                if r < rows - 1 or i < cell_h - 1:
                    out.append("\n")
        return out
