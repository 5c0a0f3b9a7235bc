"""One user's figures over the window and their requests open right now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.screen import Screen
from textual.widgets import Footer

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import FoldKey, SnapView, as_num, as_str
from llmtop.tui.stale_rows import StaleRows
from llmtop.tui.widgets.base import ViewPanel
from llmtop.tui.widgets.header import HeaderBar, HeaderStatus
from llmtop.tui.widgets.requests import FOLD, ONE_USER, RequestsTable
from llmtop.tui.widgets.users import FOLD_LABEL, is_fold

KNOWN: tuple[tuple[str, str, str], ...] = (
    ("requests", "requests", "count"),
    ("in_flight", "in flight", "count"),
    ("waiting", "waiting", "count"),
    ("streaming", "streaming", "count"),
    ("rps", "requests/s", "rate"),
    ("output_tps", "output tok/s", "rate"),
    ("input_tps", "input tok/s", "rate"),
    ("output_tokens", "output tokens", "count"),
    ("input_tokens", "input tokens", "count"),
    ("ttft_p50", "TTFT p50", "ttft"),
    ("ttft_p95", "TTFT p95", "ttft"),
    ("ttft_p99", "TTFT p99", "ttft"),
    ("itl_p50", "ITL p50", "itl"),
    ("itl_p95", "ITL p95", "itl"),
    ("itl_p99", "ITL p99", "itl"),
    ("tpot_p95", "TPOT p95", "tpot"),
    ("e2e_p95", "E2E p95", "e2e"),
    ("slo_attainment", "SLO attainment", "attainment"),
    ("slo_met", "met every SLO", "count"),
    ("slo_judged", "judged on SLOs", "count"),
    ("goodput_tps", "goodput tok/s", "rate"),
    ("goodput_rps", "goodput req/s", "rate"),
    ("errors", "errors", "count"),
    ("cancelled", "cancelled", "count"),
    ("timeouts", "timeouts", "count"),
)
BOUNDED = frozenset({"ttft", "itl", "tpot", "e2e"})
"""The kinds of :data:`KNOWN` that are percentiles: upper bounds in an approximate row."""
ROWS_KEPT = 1
"""Request rows the detail keeps on screen at any height: chrome gives way first."""
FOOTER_LINES = 1
FRAME_LINES = 2
"""The requests table's border, top and bottom."""


def other_field(key: str, value: object) -> tuple[Text, Text]:
    """A numeric field the screen does not know: its name in words, an integer as an
    integer (a count), anything else as a rate."""
    n = as_num(value)
    shown = fmt.count(n) if isinstance(value, int) else fmt.rate(n)
    return Text(printable(key).replace("_", " ")), Text(shown)


class UserSummary(ViewPanel):
    """The user's row, every known field labelled, then any other numeric fields.
    With :attr:`max_lines` set (a terminal too short for all of it), the lines that fit
    and then "+N more figures": never figures cut off without a word."""

    DEFAULT_CSS = """
    UserSummary { height: auto; padding: 0 1; }
    """

    def __init__(self, user: str) -> None:
        super().__init__(id="user-summary")
        self.user = user
        self.max_lines: int | None = None

    def set_max_lines(self, lines: int | None) -> None:
        if lines != self.max_lines:
            self.max_lines = lines
            self.refresh(layout=True)

    def lines(self, width: int) -> int:
        """How many lines the whole summary takes at ``width`` cells (uncapped)."""
        console = self.app.console
        return len(console.render_lines(
            self.build(width, capped=False),
            console.options.update(width=max(1, width), height=None), pad=False))

    def build(self, width: int, *, capped: bool = True) -> RenderableType:
        v, pal = self.view, self.palette
        title = Text(no_wrap=True, overflow="ellipsis")
        row = v.user(self.user)
        if isinstance(self.user, FoldKey):
            top = v.num("top_users")
            title.append(FOLD_LABEL, "bold")
            past = f"the top {fmt.count(top)}" if top is not None else "the top users"
            title.append(f"  every user past {past}, in one row", pal.dim)
        else:
            title.append("user ", pal.dim)
            title.append(printable(self.user) or "(empty)", "bold")
        title.append(f"  · window {fmt.window(v.window_s)}", pal.dim)
        if row is None:
            title.append("\nno requests from this user in this window", pal.dim)
            return title
        cells: list[tuple[Text, Text]] = []
        shown = {"user"}
        for key, label, kind in KNOWN:
            if key not in row:
                continue
            shown.add(key)
            value = self._value(row.get(key), kind, v, pal)
            if kind in BOUNDED and row.get("approximate") is True and value.plain != fmt.NA:
                # merged from proxies without per-user histograms: the largest part's
                # percentile, an upper bound, marked "≤" as the users table marks it
                value = Text.assemble("≤", value)
            cells.append((Text(label), value))
        for key, value in row.items():
            if key in shown or as_num(value) is None:
                continue
            cells.append(other_field(str(key), value))
        # Two label/value pairs a line where they fit whole, else one: never a cut value.
        pair = max((a.cell_len for a, _ in cells), default=0) + 2 + max(
            (b.cell_len for _, b in cells), default=0)
        per_line = 2 if 2 * pair + 2 <= width else 1
        table = Table.grid(padding=(0, 2))
        for _ in range(per_line):
            table.add_column(style=pal.dim, no_wrap=True)
            table.add_column(justify="right", no_wrap=True)
        blank = (Text(""), Text(""))
        rows = -(-len(cells) // per_line)
        more: Text | None = None
        if capped and self.max_lines is not None and 1 + rows > self.max_lines:
            rows = max(0, self.max_lines - 2)  # the title, the rows, "+N more"
            hidden = len(cells) - rows * per_line
            more = Text(f"+{hidden} more figures", pal.dim,
                        no_wrap=True, overflow="ellipsis")
            if self.max_lines < 2:
                more = None  # the title alone: whose figures these are
        for i in range(0, rows * per_line, per_line):
            line = [*cells[i:i + per_line]]
            line += [blank] * (per_line - len(line))
            table.add_row(*(x for pair_cells in line for x in pair_cells))
        out = Table.grid()
        out.add_row(title)
        if rows:
            out.add_row(table)
        if more is not None:
            out.add_row(more)
        return out

    @staticmethod
    def _value(x: object, kind: str, v: SnapView, pal: Palette) -> Text:
        n = as_num(x)
        if kind == "count":
            return Text(fmt.count(n))
        if kind == "rate":
            return Text(fmt.rate(n))
        if kind == "attainment":
            return Text(fmt.attainment(n, v.slo.target),
                        style=pal.attainment(n, v.slo.target))
        limit = v.slo.for_metric(kind)
        return Text(fmt.latency_against(n, limit), style=pal.latency(n, limit))


class UserDetail(Screen[None]):
    """Drill-in on one user; escape (or backspace) returns to the dashboard."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,backspace", "app.pop_screen", "back", show=True),
    ]

    DEFAULT_CSS = """
    UserDetail RequestsTable { border: round $primary-darken-2; height: 1fr; }
    UserDetail.-compact RequestsTable { border: none; }
    """

    def __init__(self, user: str) -> None:
        super().__init__()
        self.user = user
        """The user id, or :data:`FOLD_KEY` for the users past the top N."""
        self.fold = isinstance(user, FoldKey)
        self.header = HeaderBar(id="user-header")
        self.summary = UserSummary(user)
        # the fold's requests: every user's but the tracked ones' (see apply)
        who = FOLD_LABEL if self.fold else printable(user) or "(empty)"
        self.requests = RequestsTable(id="user-requests", user=None if self.fold else user,
                                      layout=FOLD if self.fold else ONE_USER,
                                      title=f"active requests of {who}")

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.summary
        yield self.requests
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.requests.focus()

    def apply(
        self,
        view: SnapView,
        palette: Palette,
        active: Sequence[Mapping[str, Any]],
        status: HeaderStatus,
        *,
        stale: StaleRows | None = None,
    ) -> None:
        self.header.set_status(status)
        self.header.show(view, palette)
        self.summary.show(view, palette)
        if self.fold:  # the requests of every user not tracked
            names = (as_str(u.get("user")) for u in view.items("users") if not is_fold(u))
            self.requests.exclude = frozenset(n for n in names if n is not None)
        self.requests.show_requests(active, palette, view.slo.ttft_s,
                                    (stale or StaleRows()).label())
        self.fit()

    def on_resize(self, event: events.Resize) -> None:
        self.fit()

    def fit(self) -> None:
        """Keep :data:`ROWS_KEPT` request rows at any height (at 40×12 the header, the
        summary and the table's frame took every line: the table showed none). Chrome
        gives way first: the table's frame goes (class ``-compact``), then the summary
        shows what fits of it, and says how many figures it leaves out."""
        width, height = self.size
        if width <= 0 or height <= 0:
            return  # not laid out yet: the first resize calls again
        header = self.header.get_content_height(Size(0, 0), Size(0, 0), width)
        inner = max(1, width - self.summary.styles.gutter.width)
        summary = self.summary.lines(inner)
        table = 1 + ROWS_KEPT  # the column names, then the rows kept
        left = height - header - FOOTER_LINES - summary
        compact = left < FRAME_LINES + table
        self.set_class(compact, "-compact")
        cap = height - header - FOOTER_LINES - table
        self.summary.set_max_lines(max(1, cap) if compact and summary > cap else None)
