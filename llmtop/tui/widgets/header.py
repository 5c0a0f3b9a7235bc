"""The two header lines: where the data comes from and its state, then the system's
headline figures (RPS, output TPS, in flight, errors, goodput, SLO attainment)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.text import Text

from llmtop.tui import fmt
from llmtop.tui.snapview import SnapView
from llmtop.tui.widgets.base import ViewPanel


@dataclass(frozen=True, slots=True)
class HeaderStatus:
    """The app's own state, shown next to the snapshot's figures."""

    source: str = ""
    window_s: int | None = 60
    paused: bool = False
    connected: bool = True
    error: str | None = None
    has_data: bool = False
    replay: str | None = None
    """e.g. "replay 1:02/5:00 ×2" for replay sources."""
    proxy: str | None = None
    """The URL clients send their requests to, when the command knows it (``run`` and
    ``demo``; with ``--listen :0`` it is the only place the port is shown)."""
    admin: str | None = None
    """The admin API the source reads, when the command started it (``run`` and ``demo``):
    what ``llmtop attach`` and ``curl`` need, shown at every width."""


SEP = " │ "


def _beside(url: str, proxy: str | None) -> str:
    """``url`` short next to the proxy's: ``:9001`` when only the port differs (narrow
    terminals keep the upstream and window in view), else the whole URL."""
    head, sep, port = url.rpartition(":")
    if proxy and sep and port.isdigit() and proxy.rpartition(":")[0] == head:
        return f":{port}"
    return url


class HeaderBar(ViewPanel):
    """Line 1: proxy and admin addresses, state flags, upstream, window, uptime, source.
    Line 2: system figures."""

    READS = ("system", "recording", "upstream", "uptime_s", "started_at", "time", "slo")

    def layout_key(self, view: SnapView) -> object:
        return None  # always the same number of lines

    DEFAULT_CSS = """
    HeaderBar { height: auto; background: $panel; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.status = HeaderStatus()

    def set_status(self, status: HeaderStatus) -> None:
        if status != self.status:
            self.status = status
            self.refresh()

    def _line1(self, wide: bool) -> Text:
        st, pal, v = self.status, self.palette, self.view
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("llmtop", "bold")
        if st.proxy:
            t.append(SEP)
            t.append("proxy ", pal.dim)  # labelled even when narrow: two bare URLs confuse
            t.append(st.proxy)
        if st.admin:
            t.append(SEP)
            t.append("admin ", pal.dim)
            t.append(st.admin if wide else _beside(st.admin, st.proxy))
        if not st.connected:
            t.append(SEP)
            why = f" ({st.error})" if st.error else ""
            t.append(f"DISCONNECTED — retrying{why}", f"bold reverse {pal.bad}")
        if st.paused:
            t.append(SEP)
            t.append("PAUSED", f"bold reverse {pal.warn}")
        if st.replay:
            t.append(SEP)
            t.append(st.replay, pal.accent)
        rec = v.recording_path
        if rec is not None:
            t.append(SEP)
            t.append("● REC", f"bold {pal.bad}")
            if rec:
                t.append(" ")
                t.append(rec)
        t.append(SEP)
        if wide:
            t.append("upstream ", pal.dim)
        t.append(v.text("upstream") or fmt.NA)
        t.append(SEP)
        t.append("window ", pal.dim)
        t.append(fmt.window(st.window_s))
        t.append(SEP)
        t.append("up ", pal.dim)
        t.append(fmt.duration(v.uptime_s))
        if st.source and (wide or not v.text("upstream")) and not (
                st.admin and st.source.startswith(st.admin)):  # named already
            t.append(SEP)
            t.append("via ", pal.dim)
            t.append(st.source)
        return t

    def _line2(self, wide: bool) -> Text:
        v, pal = self.view, self.palette
        t = Text(no_wrap=True, overflow="ellipsis")
        if not self.status.has_data:
            t.append("waiting for the first snapshot…", pal.dim)
            return t

        def fig(label: str, value: str, style: str = "bold") -> None:
            if len(t):
                t.append(SEP)
            t.append(label, pal.dim)
            t.append(value, style if value != fmt.NA else pal.dim)

        fig("RPS ", fmt.rate(v.num("system", "rps")))
        fig("out " if wide else "", fmt.rate(v.num("system", "output_tps")),
            f"bold {pal.accent}")
        t.append(" tok/s", pal.dim)
        waiting, streaming = v.num("system", "waiting"), v.num("system", "streaming")
        fig("in flight " if wide else "flight ", fmt.count(v.num("system", "in_flight")))
        if wide:
            t.append(f" ({fmt.count(waiting)} wait / {fmt.count(streaming)} stream)", pal.dim)
        else:
            t.append(f" ({fmt.count(waiting)}w/{fmt.count(streaming)}s)", pal.dim)
        errors = v.num("system", "errors")
        fig("errors " if wide else "err ", fmt.count(errors), pal.bad if errors else "bold")
        fig("goodput ", fmt.rate(v.num("system", "goodput_tps")))
        if wide:
            t.append(" tok/s", pal.dim)
        att = v.num("system", "slo_attainment")
        target = v.slo.target
        fig("SLO ", fmt.pct(att, fraction=True), f"bold {pal.attainment(att, target)}")
        if target is not None and wide:
            t.append(f" (target {fmt.pct(target, fraction=True)})", pal.dim)
        return t

    def build(self, width: int) -> RenderableType:
        wide = width >= 120
        return Group(self._line1(wide), self._line2(wide))
