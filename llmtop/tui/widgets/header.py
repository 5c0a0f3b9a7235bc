"""The two header lines: where the data comes from and its state, then the system's
headline figures (RPS, output TPS, in flight, errors, goodput, SLO attainment)."""

from __future__ import annotations

import time
from collections.abc import Callable
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
    paused_at: float | None = None
    """Paused: the time of the figures on screen (the snapshot's own), said beside
    PAUSED, so that how old they are — and that seeking a replay moved them — is seen."""
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
    down: str | None = None
    """Some of several attached proxies do not answer (e.g. "1/2 proxies down"): shown
    at every width, like DISCONNECTED when none answers."""
    window_pending: bool = False
    """``w`` asked for :attr:`asked_window_s` and its data has not arrived yet:
    :attr:`window_s` is still the window of the figures shown."""
    asked_window_s: int | None = None
    stale_s: int | None = None
    """Disconnected with data on screen: whole seconds since that data arrived (the
    figures are the last ones known, not live ones)."""


SEP = " │ "
MIN_PATH = 8
"""The fewest cells a recording path is cut to ("llmtop-…") before only "● REC" is left."""
MIN_WHY = 12
"""The fewest cells the reason a source is down is cut to ("HTTP 401: t…") before only
"DISCONNECTED — retrying" is left."""


class _Keep:
    """A step that leaves its part as it is (a variant that does not apply here)."""


_KEEP = _Keep()
Step = Text | None | _Keep | Callable[[int], Text | None]
"""A way to make one part of a line narrower: a shorter text, ``None`` (leave it out), or
a function of the room the part would have (cells) giving either."""


def _joined_width(parts: dict[str, Text | None]) -> int:
    shown = [t for t in parts.values() if t is not None]
    return sum(t.cell_len for t in shown) + len(SEP) * max(0, len(shown) - 1)


def fit_parts(parts: dict[str, Text | None], steps: list[tuple[str, Step]],
              width: int) -> Text:
    """``parts`` (in display order) joined by :data:`SEP` in ``width`` cells: the
    ``steps`` are taken in order, each shortening or leaving out one part, until the line
    fits; what still does not fit is cut with an ellipsis at the end."""
    parts = dict(parts)
    for name, step in steps:
        if _joined_width(parts) <= width:
            break
        if parts.get(name) is None or isinstance(step, _Keep):
            continue
        if callable(step):
            others = _joined_width({**parts, name: None})
            step = step(width - others - (len(SEP) if others else 0))
        parts[name] = step
    line = Text(no_wrap=True, overflow="ellipsis")
    for t in parts.values():
        if t is not None:
            if len(line):
                line.append(SEP)
            line.append_text(t)
    line.truncate(width, overflow="ellipsis")
    return line


def _rec(path: str, style: str, label: str = "● REC") -> Text:
    t = Text.assemble((label, f"bold {style}"))
    if path:
        t.append(" ")
        t.append(path)
    return t


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

    # (docked with the warnings bar, in the dashboard's #head: at tiny sizes the screen
    # scrolls to the focused users table, and the state must not scroll away)
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

    def _line1(self, wide: bool, width: int) -> Text:
        """Every part at its fullest, then shortened or left out (:func:`fit_parts`)
        least important first, so the state (disconnected, proxies down, paused) and the
        window stay in view at any width."""
        st, pal, v = self.status, self.palette, self.view
        parts: dict[str, Text | None] = {"title": Text("llmtop", "bold")}
        down_style = f"bold reverse {pal.bad}"
        error = st.error or ""

        def disconnected(why: str) -> Text:
            return Text(f"DISCONNECTED — retrying ({why})" if why
                        else "DISCONNECTED — retrying", down_style)

        # one proxy's error starts with its address (the source's label's first word),
        # which the header names elsewhere (via, admin) where there is room: where there
        # is not, why it is down matters more
        where = st.source.split(" ", 1)[0]
        brief = error.removeprefix(f"{where}: ") if where else error

        def why_in(room: int) -> Text:
            """The reason cut to ``room`` cells; none where too little of it would show."""
            left = room - disconnected("").cell_len - 3
            return disconnected(fmt.clip(brief, left)) if left >= MIN_WHY else (
                disconnected(""))

        if not st.connected:
            parts["disconnected"] = disconnected(error)
        if st.down:
            parts["down"] = Text(st.down, f"bold reverse {pal.bad}")
        paused_style = f"bold reverse {pal.warn}"
        if st.paused:
            parts["paused"] = Text(
                "PAUSED" if st.paused_at is None else
                f"PAUSED at {time.strftime('%H:%M:%S', time.localtime(st.paused_at))}",
                paused_style)
        if st.proxy:
            # labelled even when narrow: two bare URLs confuse
            parts["proxy"] = Text.assemble(("proxy ", pal.dim), st.proxy)
        if st.admin:
            parts["admin"] = Text.assemble(
                ("admin ", pal.dim), st.admin if wide else _beside(st.admin, st.proxy))
        if st.replay:
            parts["replay"] = Text(st.replay, pal.accent)
        rec = v.recording_path
        # a recording that stopped writing (disk full, file gone): the proxy's stderr and
        # summary say so, but under the TUI neither is seen until it exits; so is another
        # live process writing its stem (two proxies given one --record)
        label = ("● REC FAILED" if v.recording_failed
                 else "● REC SHARED" if v.recording_shared else "● REC")
        if rec is not None:
            parts["rec"] = _rec(rec, pal.bad, label)
        upstream = v.text("upstream")
        parts["upstream"] = Text.assemble(("upstream ", pal.dim) if wide else "",
                                          upstream or fmt.NA)
        window = Text.assemble(("window ", pal.dim), fmt.window(st.window_s))
        if st.window_pending:
            window.append(f" → {fmt.window(st.asked_window_s)}…", pal.warn)
        parts["window"] = window
        parts["up"] = Text.assemble(("up ", pal.dim), fmt.duration(v.uptime_s))
        if st.source and (wide or not upstream) and not (
                st.admin and st.source.startswith(st.admin)):  # named already
            parts["via"] = Text.assemble(("via ", pal.dim), st.source)
        base = rec.replace("\\", "/").rpartition("/")[2] if rec else ""
        steps: list[tuple[str, Step]] = [
            ("via", None),
            ("rec", _rec(base, pal.bad, label) if base != rec else _KEEP),
            ("title", None),
            ("paused", Text("PAUSED", paused_style) if st.paused_at is not None else _KEEP),
            ("up", None),
            ("upstream", Text(upstream or fmt.NA) if wide else _KEEP),
            ("upstream", None),
            ("disconnected", disconnected(brief) if brief != error else _KEEP),
            ("rec", lambda room: _rec(fmt.clip(base, max(0, room - len(label) - 1)), pal.bad,
                                      label)
             if room - len(label) - 1 >= MIN_PATH else _rec("", pal.bad, label)),
            ("disconnected", why_in),
            ("admin", Text.assemble(("admin ", pal.dim), _beside(st.admin, st.proxy))
             if st.admin and wide else _KEEP),
            ("replay", None),
            ("proxy", None),
            ("admin", None),
            ("disconnected", Text("DISCONNECTED", down_style)),
        ]
        return fit_parts(parts, steps, width)

    def _line2(self, wide: bool, width: int | None = None) -> Text:
        """The system's figures in ``width`` cells (all of them when ``None``). Where
        they do not all fit, the least telling give way first (the in-flight breakdown,
        the SLO target, goodput, in flight, output tok/s), so that errors and the SLO
        attainment, the alarms, stay in view: cut at the end, they were the first to go
        (60 columns: "… │ err 3 │ …"; 40: "… flight 48 …")."""
        v, pal = self.view, self.palette
        t = Text(no_wrap=True, overflow="ellipsis")
        if not self.status.has_data:
            t.append("waiting for the first snapshot…", pal.dim)
            return t
        stale = self.status.stale_s
        if stale is not None:  # the last figures known: said so, and none bold or coloured
            t.append(f"as of {fmt.duration(stale)} ago: ", f"bold {pal.warn}")

        def fig(label: str, value: str, style: str = "bold") -> Text:
            part = Text()
            part.append(label, pal.dim)
            part.append(value, style if value != fmt.NA and stale is None else pal.dim)
            return part

        out = fig("out " if wide else "", fmt.rate(v.num("system", "output_tps")),
                  f"bold {pal.accent}")
        out.append(" tok/s", pal.dim)
        waiting, streaming = v.num("system", "waiting"), v.num("system", "streaming")
        flight = fig("in flight " if wide else "flight ", fmt.count(v.num("system", "in_flight")))
        brief = flight.copy()
        if waiting is None and streaming is None:
            pass  # "n/a (n/a wait / n/a stream)" says "n/a" three times
        elif wide:
            flight.append(f" ({fmt.count(waiting)} wait / {fmt.count(streaming)} stream)",
                          pal.dim)
        else:
            flight.append(f" ({fmt.count(waiting)}w/{fmt.count(streaming)}s)", pal.dim)
        errors = v.num("system", "errors")
        err = fig("errors " if wide else "err ", fmt.count(errors), pal.bad if errors else "bold")
        goodput = fig("goodput ", fmt.rate(v.num("system", "goodput_tps")))
        if wide:
            goodput.append(" tok/s", pal.dim)
        att = v.num("system", "slo_attainment")
        target = v.slo.target
        slo = fig("SLO ", fmt.attainment(att, target), f"bold {pal.attainment(att, target)}")
        slo_brief = slo.copy()
        if target is not None and wide:
            slo.append(f" (target {fmt.pct(target, fraction=True)})", pal.dim)
        parts: dict[str, Text | None] = {
            "rps": fig("RPS ", fmt.rate(v.num("system", "rps"))), "out": out,
            "flight": flight, "err": err, "goodput": goodput, "slo": slo}
        steps: list[tuple[str, Step]] = [
            ("flight", brief), ("slo", slo_brief), ("goodput", None), ("flight", None),
            ("out", None)]
        room = 10_000 if width is None else max(1, width - t.cell_len)
        t.append_text(fit_parts(parts, steps, room))
        return t

    def build(self, width: int) -> RenderableType:
        wide = width >= 120
        return Group(self._line1(wide, width), self._line2(wide, width))
