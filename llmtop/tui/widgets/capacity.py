"""The capacity line: the largest concurrency that still meets the SLOs, and the goodput
there — estimated live from production traffic by the metrics side."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.base import ViewPanel


class CapacityLine(ViewPanel):
    """"max concurrency at SLO ≈ N, goodput ≈ X tok/s", or "collecting data…". With more
    requests in flight than N: "over capacity" once a level above N has failed the target,
    else "above every level measured so far" (no evidence yet that it is too many). When
    even the lowest level seen misses the SLOs (N = 0): "none — even concurrency 1 misses
    the SLOs", as ``llmtop bench`` says it, not "≈ 0, goodput ≈ 0 tok/s"."""

    READS = ("capacity", "system")

    def layout_key(self, view: SnapView) -> object:
        return None  # always the same number of lines

    DEFAULT_CSS = """
    CapacityLine { height: auto; padding: 0 1; }
    """

    def build(self, width: int) -> RenderableType:
        line = self._line(compact=False)
        for brevity in (1, 2, 3):  # shorter wordings, the in-flight verdict kept to the last
            if line.cell_len <= width:
                break
            line = self._line(compact=True, brevity=brevity)
        return line

    def _line(self, *, compact: bool, brevity: int = 1) -> Text:
        """The line; ``compact`` words it shorter for about 80 columns, the in-flight
        verdict kept; ``brevity`` 2 leaves out the goodput at capacity (60 columns: the
        verdict "48 in flight: over capacity" was cut to "48 in fl…"), 3 says the
        verdict shortest ("capacity ≈ 12 · now 48: over capacity", 40 columns). Anything
        still too wide ends in "…"."""
        v, pal = self.view, self.palette
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("capacity ", "bold")
        if not v.raw:
            t.append(fmt.NA, pal.dim)
            return t
        n = v.num("capacity", "max_concurrency_at_slo")
        tps = v.num("capacity", "goodput_tps_at_slo")
        failing = v.num("capacity", "first_failing_concurrency")
        if n is None and failing is not None:  # a level failed; too little data below it
            t.append("max concurrency at SLO < ", pal.dim)
            t.append(fmt.count(failing), f"bold {pal.warn}")
            t.append("  (the SLOs fail there; too few requests at lower levels yet)", pal.dim)
            return t
        if n is None:
            t.append("max concurrency at SLO: collecting data…", pal.dim)
        elif n == 0:  # the lowest level seen already misses: no concurrency meets the SLOs
            t.append("at SLO: " if compact else "max concurrency at SLO: ", pal.dim)
            t.append("none", f"bold {pal.bad}")
            t.append(" — ", pal.dim)
            t.append(self._none_why(failing, compact), pal.bad)
        else:
            t.append("≈ " if compact else "max concurrency at SLO ≈ ", pal.dim)
            t.append(fmt.count(n), f"bold {pal.accent}")
            if brevity == 2:
                t.append(" at SLO", pal.dim)
            elif brevity < 2:
                t.append(" at SLO · goodput ≈ " if compact else ", goodput ≈ ", pal.dim)
                t.append(fmt.rate(tps), f"bold {pal.accent}" if tps is not None else pal.dim)
                t.append(" tok/s", pal.dim)
            in_flight = v.num("system", "in_flight")
            if in_flight is not None and in_flight > n:
                now = f" · {fmt.count(in_flight)}" if compact else f"  — now {fmt.count(in_flight)}"
                if brevity == 3:
                    verdict = ("over capacity" if failing is not None
                               else "above the levels measured")
                    t.append(f" · now {fmt.count(in_flight)}: {verdict}",
                             pal.bad if failing is not None else pal.warn)
                elif failing is not None:
                    t.append(f"{now} in flight: over capacity", pal.bad)
                else:  # nothing above n has failed: n is what was measured, not a limit
                    above = "above the levels measured" if compact else (
                        "above every level measured so far")
                    t.append(f"{now} in flight: {above}", pal.warn)
        note = v.text("capacity", "note") or v.text("capacity", "reason")
        need = v.num("capacity", "min_requests_per_bin")
        if not note and n is None and need is not None:
            note = f"needs ≥ {fmt.count(need)} finished requests at a concurrency level"
        if note:
            t.append(f"  ({note})", pal.dim)
        return t

    @staticmethod
    def _none_why(failing: float | None, compact: bool) -> str:
        """Why the capacity is none, as ``llmtop bench`` says it: the lowest level seen
        (concurrency 1, or the lowest the traffic reached) misses the SLOs."""
        if failing is None:
            return "no load level seen meets the SLOs"
        level = fmt.count(failing)
        if failing <= 1:
            return f"even concurrency {level} misses the SLOs"
        if compact:
            return f"even concurrency {level} (lowest seen) misses the SLOs"
        return f"even concurrency {level}, the lowest seen, misses the SLOs"
