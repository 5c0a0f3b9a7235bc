"""The users table: who is causing load and who is unhappy. Sortable (``s`` cycles the
column, ``S`` reverses it, or click a header), filterable (``/``); ``enter`` opens a user."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num, as_str

USER_WIDTH = 28


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    kind: str
    """text, count, rate, latency or attainment."""
    descending: bool = True
    """The natural order when first sorted by this column (largest first)."""
    slo_metric: str | None = None


COLUMNS: tuple[Column, ...] = (
    Column("user", "user", "text", descending=False),
    Column("in_flight", "in flight", "count"),
    Column("requests", "requests", "count"),
    Column("output_tps", "out tok/s", "rate"),
    Column("ttft_p95", "TTFT p95", "latency", slo_metric="ttft"),
    Column("itl_p95", "ITL p95", "latency", slo_metric="itl"),
    Column("slo_attainment", "SLO", "attainment", descending=False),
)
DEFAULT_SORT = 3


def user_label(name: str) -> str:
    """How a user id is shown: never empty, never wider than the column."""
    if not name:
        return "(empty)"
    return name if len(name) <= USER_WIDTH else name[: USER_WIDTH - 1] + "…"


def matches(name: str, needle: str) -> bool:
    return not needle or needle.casefold() in name.casefold()


def sort_users(
    users: Sequence[Mapping[str, Any]], column: Column, reverse: bool
) -> list[Mapping[str, Any]]:
    """Sorted by ``column``; rows without a value always last; ties by user name."""
    if column.kind == "text":
        return sorted(users, key=lambda u: (as_str(u.get("user")) or "").casefold(),
                      reverse=reverse)
    have = [u for u in users if as_num(u.get(column.key)) is not None]
    missing = [u for u in users if as_num(u.get(column.key)) is None]
    have.sort(key=lambda u: as_str(u.get("user")) or "")
    have.sort(key=lambda u: as_num(u.get(column.key)) or 0.0, reverse=reverse)
    missing.sort(key=lambda u: as_str(u.get("user")) or "")
    return have + missing


def cell(column: Column, user: Mapping[str, Any], view: SnapView, pal: Palette) -> Text:
    if column.kind == "text":
        return Text(user_label(as_str(user.get(column.key)) or ""), no_wrap=True)
    v = as_num(user.get(column.key))
    if column.kind == "latency":
        threshold = view.slo.for_metric(column.slo_metric or "")
        # Merged from proxies without per-user histograms: an upper bound, marked "≤".
        bound = "≤" if user.get("approximate") is True and v is not None else ""
        return Text(bound + fmt.latency(v), style=pal.latency(v, threshold), justify="right")
    if column.kind == "attainment":
        return Text(fmt.pct(v, fraction=True), style=pal.attainment(v, view.slo.target),
                    justify="right")
    text = fmt.rate(v) if column.kind == "rate" else fmt.count(v)
    return Text(text, style="" if v is not None else pal.dim, justify="right")


class UsersTable(DataTable[Text]):
    """Users of the current window, one row each; the row key maps back to the user id."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "detail", show=True)]

    DEFAULT_CSS = """
    UsersTable { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.sort_index = DEFAULT_SORT
        self.sort_reverse = COLUMNS[DEFAULT_SORT].descending
        self.filter_text = ""
        self.view = SnapView(None)
        self.palette = Palette()
        self._users: dict[str, str] = {}
        self._rendered: list[tuple[str, tuple[str, ...]]] | None = None
        self._header: tuple[int, bool] | None = None
        self._shown = 0

    @property
    def sort_column(self) -> Column:
        return COLUMNS[self.sort_index]

    def user_for(self, row_key: object) -> str | None:
        """The user id of a row (``RowKey`` or its value)."""
        value = getattr(row_key, "value", row_key)
        return self._users.get(str(value)) if value is not None else None

    def cursor_user(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return self.user_for(key)

    def cycle_sort(self) -> None:
        """Sort by the next column, in that column's natural order."""
        self.sort_index = (self.sort_index + 1) % len(COLUMNS)
        self.sort_reverse = self.sort_column.descending
        self.redraw()

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.redraw()

    def sort_by(self, key: str) -> None:
        """Sort by the column ``key``; sorting by the same column again reverses it."""
        for i, c in enumerate(COLUMNS):
            if c.key == key:
                if i == self.sort_index:
                    self.sort_reverse = not self.sort_reverse
                else:
                    self.sort_index, self.sort_reverse = i, c.descending
                self.redraw()
                return

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self.redraw()

    def show(self, view: SnapView, palette: Palette) -> None:
        self.view, self.palette = view, palette
        self.redraw()

    def _headers(self) -> None:
        state = (self.sort_index, self.sort_reverse)
        if self._header == state:
            return
        self._header = state
        self.clear(columns=True)
        for i, c in enumerate(COLUMNS):
            label = c.label
            if i == self.sort_index:
                label += " ▼" if self.sort_reverse else " ▲"
            self.add_column(Text(label, justify="left" if c.kind == "text" else "right"),
                            key=c.key)
        self._rendered = None

    def redraw(self) -> None:
        """Rebuild the rows (only when something visible changed); keep the cursor's user."""
        self._headers()
        users = [u for u in self.view.items("users")
                 if matches(as_str(u.get("user")) or "", self.filter_text)]
        self._shown = len(users)
        ordered = sort_users(users, self.sort_column, self.sort_reverse)
        rows: list[tuple[str, list[Text]]] = []
        seen: dict[str, int] = {}
        for u in ordered:
            name = as_str(u.get("user")) or ""
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name}\x00{seen[name]}"
            rows.append((key, [cell(c, u, self.view, self.palette) for c in COLUMNS]))
        signature = [(k, tuple(f"{c.plain}\x00{c.style}" for c in cells)) for k, cells in rows]
        if signature == self._rendered:
            return
        current = self.cursor_user()
        self.clear()
        self._users = {}
        for key, cells in rows:
            self.add_row(*cells, key=key)
            self._users[key] = key.split("\x00", 1)[0]
        self._rendered = signature
        if current is not None and current in self._users:
            self.move_cursor(row=self.get_row_index(current), animate=False)

    def subtitle(self) -> Text:
        """"N users" or "n of N users · filter: …" (the filter as plain text)."""
        shown = self._shown
        total = len(self.view.items("users"))
        t = Text(f"{shown} of {total} users" if self.filter_text else f"{total} users")
        if self.filter_text:
            t.append(" · filter: ")
            t.append(self.filter_text)
        return t

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))
