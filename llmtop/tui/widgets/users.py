"""The users table: who is causing load and who is unhappy. Sortable (``s`` cycles the
column, ``S`` reverses it, or click a header), filterable (``/``); ``enter`` opens a user."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import FOLD_KEY as SNAP_FOLD_KEY
from llmtop.tui.snapview import Slo, SnapView, as_num, as_str
from llmtop.tui.widgets.fixedtable import FixedWidthTable

USER_WIDTH = 28
USER_MIN = 12
"""The user column is cut (with "…") down to this before a figure column is dropped."""
PAD = 1
"""The table's cell padding on each side of a column."""


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
PRIORITY: tuple[str, ...] = (
    "output_tps", "ttft_p95", "slo_attainment", "in_flight", "itl_p95", "requests")
"""Which figure columns stay when not all fit (after the sort column, which always
does): load first, then who is unhappy, the request count last."""
KIND_WIDTH = {"count": 7, "rate": 6, "latency": 8, "attainment": 4}
"""Room a column keeps for its values whatever they are now ("999,999", "12,345",
"≤12m34s"...), so its width does not jump as the figures change."""


FOLD_LABEL = "(others)"
"""How the row of users past the top N (the snapshot's untracked row, named "other") is
shown: not a user, so never taken for one called "other"."""
FOLD_KEY = SNAP_FOLD_KEY
"""What :meth:`UsersTable.user_for` gives for that row (a user called "other" gives
"other"): a ``str`` equal to no user id, which :meth:`SnapView.user` knows."""
FOLD_ROW = "fold"
"""The fold row's row key. A user's row key is ``u<n>:<id>`` (:func:`row_key`): keys are
the table's own, never a user id, so no id (an empty one, "fold", "\\x00other",
"alice\\x00evil") can take another row's key or crash the table with a duplicate."""


def row_key(name: str, n: int = 1) -> str:
    """The row key of the ``n``-th row of user ``name`` (a merged snapshot may hold more
    than one): distinct for distinct ``(name, n)``, and never :data:`FOLD_ROW`."""
    return f"u{n}:{name}"


def is_fold(user: Mapping[str, Any]) -> bool:
    """The row the proxy folds every user past its top N into (``tracked`` false)."""
    return user.get("tracked") is False


def users(n: int) -> str:
    """"1 user", "3 users"."""
    return f"{n} user" if n == 1 else f"{n} users"


def header_label(column: Column, sorted_by: bool, reverse: bool) -> str:
    return column.label + ((" ▼" if reverse else " ▲") if sorted_by else "")


def fit_columns(
    widths: Mapping[str, int], avail: int, sort_key: str
) -> tuple[list[Column], int]:
    """The columns to show in ``avail`` cells, in table order, and the user column's
    width. ``widths`` is each column's natural width (header included, padding not).
    Figure columns that do not fit are dropped whole, least important first; the user
    column gives up room down to ``USER_MIN`` before any figure column is dropped and
    takes whatever is left over, up to its natural width."""
    user_natural = widths["user"]
    user_min = min(user_natural, USER_MIN)
    budget = avail - (user_min + 2 * PAD)
    keep = {"user"}
    order = [sort_key] + [k for k in PRIORITY if k != sort_key]
    for key in order:
        if key == "user" or key not in widths:
            continue
        need = widths[key] + 2 * PAD
        if need <= budget:
            keep.add(key)
            budget -= need
    user_w = max(1, min(user_natural, user_min + budget))
    return [c for c in COLUMNS if c.key in keep], user_w


def user_label(name: str, width: int = USER_WIDTH) -> str:
    """How a user id is shown: never empty, its control characters visible
    (``\\x1b``), never wider than ``width`` cells (cut with "…")."""
    return fmt.name(name, width)


def available_cells(table: DataTable[Text], rows: int) -> int:
    """The cells a table's columns may take: its width, less the scrollbar when the rows
    (and the header) are more than its height."""
    width = table.size.width
    if width <= 0:  # not laid out yet: everything, cut later if need be
        return 10_000
    bar = table.styles.scrollbar_size_vertical if rows + 1 > table.size.height else 0
    return width - bar


def keep_view(table: DataTable[Text], row: int, scroll_y: float) -> None:
    """After a table's rows were cleared and added again (``clear()`` puts the cursor on
    row 0 and scrolls to the top): the view scrolled as it was, the cursor on ``row``
    (the last row when there are fewer now; scrolled into view only when it is not in
    it). A live proxy's figures change at every refresh; a reader moving down the rows
    must not be sent back up each time."""
    table.scroll_to(y=scroll_y, animate=False, immediate=True)
    row = min(row, table.row_count - 1)
    if row > 0:
        table.move_cursor(row=row, animate=False)


CellSig = tuple[tuple[str, str], ...]
"""What a row shows: each cell's text and style."""


def matches(name: str, needle: str) -> bool:
    return not needle or needle.casefold() in name.casefold()


def sort_users(
    users: Sequence[Mapping[str, Any]], column: Column, reverse: bool
) -> list[Mapping[str, Any]]:
    """Sorted by ``column``; rows without a value always last; ties by user name."""
    if column.kind == "text":
        return sorted(users, key=lambda u: (as_str(u.get("user")) or "").casefold(),
                      reverse=reverse)
    # each user's value and name read once (3,000 users: sorting was most of an `s`)
    keyed = [(as_num(u.get(column.key)), as_str(u.get("user")) or "", u) for u in users]
    have = [(v, name, u) for v, name, u in keyed if v is not None]
    missing = [(name, u) for v, name, u in keyed if v is None]
    have.sort(key=lambda t: t[1])
    have.sort(key=lambda t: t[0], reverse=reverse)
    missing.sort(key=lambda t: t[0])
    return [u for _, _, u in have] + [u for _, u in missing]


def cell_text(column: Column, user: Mapping[str, Any], slo: Slo) -> str:
    """What a figure column's cell of ``user``'s row reads (:func:`cell` without its
    style): the columns' widths are made from these, for every row, cells only for the
    rows drawn."""
    v = as_num(user.get(column.key))
    if column.kind == "latency":
        # Merged from proxies without per-user histograms: an upper bound, marked "≤".
        bound = "≤" if user.get("approximate") is True and v is not None else ""
        return bound + fmt.latency_against(v, slo.for_metric(column.slo_metric or ""))
    if column.kind == "attainment":
        return fmt.attainment(v, slo.target)
    return fmt.rate(v) if column.kind == "rate" else fmt.count(v)


def text_width(s: str) -> int:
    """``cell_len(s)``, without its cost for the figures' plain ASCII."""
    return len(s) if s.isascii() else cell_len(s)


def cell(column: Column, user: Mapping[str, Any], view: SnapView, pal: Palette,
         slo: Slo | None = None) -> Text:
    """One cell of ``user``'s row. ``slo``: ``view.slo``, when the caller has it already
    (it is built anew at each ``view.slo``: once per table, not once per cell)."""
    if column.kind == "text":
        name = FOLD_LABEL if is_fold(user) else as_str(user.get(column.key)) or ""
        return Text(user_label(name), no_wrap=True)
    if slo is None:
        slo = view.slo
    text = cell_text(column, user, slo)
    v = as_num(user.get(column.key))
    if column.kind == "latency":
        threshold = slo.for_metric(column.slo_metric or "")
        return Text(text, style=pal.latency(v, threshold), justify="right")
    if column.kind == "attainment":
        return Text(text, style=pal.attainment(v, slo.target), justify="right")
    return Text(text, style="" if v is not None else pal.dim, justify="right")


def widest_figure(column: Column, users: Sequence[Mapping[str, Any]], slo: Slo,
                  base: int) -> int:
    """``max(base, widest)``, ``widest`` the widest :func:`cell_text` of ``column`` over
    ``users``, reading the text only of the values that might be wider than ``base`` (at
    least the column's :data:`KIND_WIDTH`): 3,000 users' every figure formatted at every
    refresh was a fifth of it, for widths that the headings set."""
    key = column.key
    widest = base
    if column.kind in ("count", "rate"):
        # "1,234,567": as wide as the value is large (a minus sign for one below 0),
        # so the largest and the smallest values are the widest; a rate below 100 is at
        # most "-99.9" (5 cells), "n/a" 3
        finite = [v for u in users
                  if (v := as_num(u.get(key))) is not None and math.isfinite(v)]
        text = fmt.rate if column.kind == "rate" else fmt.count
        for v in (min(finite), max(finite)) if finite else ():
            widest = max(widest, len(text(v)))
        return max(widest, 5 if column.kind == "rate" else 0, len(fmt.NA))
    for u in users:
        v = as_num(u.get(key))
        if v is not None and 0.0 <= v <= 100.0:
            # a latency below 100 s reads in at most 7 cells ("99.9 ms"), one more for
            # "≤" or ">"; both only for an approximate one over its SLO: "≤>99.9 ms".
            # An attainment from 0 to 1, at most 5 ("99.9%").
            if column.kind == "latency":
                if widest >= 8 and not (u.get("approximate") is True and v > 0.0):
                    continue
                if widest >= 9:
                    continue
            elif widest >= 5 and v <= 1.0:
                continue
        widest = max(widest, text_width(cell_text(column, u, slo)))
    return widest


FIGURES = tuple(c for c in COLUMNS if c.kind != "text")
_NO_CELL = Text("")


@dataclass(frozen=True, slots=True)
class RowCells:
    """One user's cells in every column (:data:`COLUMNS`; the user column's is made
    with the row, from the label shown) and what each shows (text and style), made
    once for as long as the user's figures do not change."""

    user: Mapping[str, Any]
    cells: tuple[Text, ...]
    sigs: tuple[tuple[str, str], ...]


def row_cells(user: Mapping[str, Any], view: SnapView, pal: Palette, slo: Slo) -> RowCells:
    cells = (_NO_CELL, *(cell(c, user, view, pal, slo) for c in FIGURES))
    return RowCells(user, cells, tuple((c.plain, str(c.style)) for c in cells))


class UsersTable(FixedWidthTable):
    """Users of the current window, one row each; the row key maps back to the user id."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "detail", show=True)]

    DEFAULT_CSS = """
    UsersTable { height: 1fr; overflow-x: hidden; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.sort_index = DEFAULT_SORT
        self.sort_reverse = COLUMNS[DEFAULT_SORT].descending
        self.filter_text = ""
        self.view = SnapView(None)
        self.palette = Palette()
        self._users: dict[str, str] = {}
        """Row key → user id (:data:`FOLD_KEY` for the fold)."""
        self._keys: list[str] | None = None
        """The row keys in the table's order (None: the table is to be filled anew)."""
        self._want: dict[str, tuple[Mapping[str, Any], str]] = {}
        """Row key → what the row should show: the user's figures and its name's label."""
        self._pending: set[str] = set()
        """Rows whose cells may not be what ``_want`` says: made when drawn or read
        (:meth:`fill_row`), or at a redraw for those in view. 3,000 users whose figures
        all move: a refresh makes the 40 rows shown, not 3,000."""
        self._row_keys: dict[str, RowKey] = {}
        """Each row's key as the table has it (made once: a re-sort gives them new places)."""
        self._shown_sig: dict[str, CellSig] = {}
        """What each row's cells in the table show now (text and style)."""
        self._cols: tuple[int, ...] = ()
        """The shown columns' indices in :data:`COLUMNS` (the user column first)."""
        self._header: object = None
        self.shown_columns: list[Column] = list(COLUMNS)
        """The columns shown at the current width (``s`` cycles through these)."""
        self._shown = 0
        self._cells: dict[str, RowCells] = {}
        """The last cells made for each row key, kept while its figures, the SLOs and the
        palette stay the same: a re-sort, and a refresh where few figures moved, make
        only the rows that changed."""
        self._cells_for: tuple[Slo, Palette] | None = None
        self._names_for: tuple[tuple[str, ...], int] | None = None
        self._names: dict[str, str] = {}
        self._widest_for: frozenset[str] | None = None
        self._widest_name = 0

    @property
    def sort_column(self) -> Column:
        return COLUMNS[self.sort_index]

    def user_for(self, row_key: object) -> str | None:
        """The user id of a row (``RowKey`` or its value); :data:`FOLD_KEY` for the fold."""
        value = getattr(row_key, "value", row_key)
        return self._users.get(value) if isinstance(value, str) else None

    def cursor_key(self) -> str | None:
        """The row key under the cursor."""
        if not self.row_count:
            return None
        try:
            value = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None
        return value if isinstance(value, str) else None

    def cursor_user(self) -> str | None:
        key = self.cursor_key()
        return None if key is None else self.user_for(key)

    def cycle_sort(self) -> None:
        """Sort by the next column shown, in that column's natural order."""
        shown = {c.key for c in self.shown_columns}
        for step in range(1, len(COLUMNS) + 1):
            i = (self.sort_index + step) % len(COLUMNS)
            if COLUMNS[i].key in shown:
                break
        self.sort_index = i
        self.sort_reverse = self.sort_column.descending
        self.redraw(resorted=True)

    def reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.redraw(resorted=True)

    def sort_by(self, key: str) -> None:
        """Sort by the column ``key``; sorting by the same column again reverses it."""
        for i, c in enumerate(COLUMNS):
            if c.key == key:
                if i == self.sort_index:
                    self.sort_reverse = not self.sort_reverse
                else:
                    self.sort_index, self.sort_reverse = i, c.descending
                self.redraw(resorted=True)
                return

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self.redraw()

    def show(self, view: SnapView, palette: Palette) -> None:
        self.view, self.palette = view, palette
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def _headers(self, visible: list[Column], widths: Mapping[str, int]) -> None:
        state = (self.sort_index, self.sort_reverse,
                 tuple((c.key, widths[c.key]) for c in visible))
        if self._header == state:
            return
        self._header = state
        self.shown_columns = visible
        labels = {c.key: (Text(header_label(c, c is self.sort_column, self.sort_reverse),
                               justify="left" if c.kind == "text" else "right"),
                          widths[c.key])
                  for c in visible}
        if [str(k.value) for k in self.columns] == list(labels):
            # the same columns (another sort): relabelled and resized, the rows kept
            self.relabel(labels)
            return
        self.clear(columns=True)
        for key, (label, width) in labels.items():
            self.add_column(label, key=key, width=width)
        self._keys = None

    def redraw(self, *, resorted: bool = False) -> None:
        """Show the rows (only what changed); keep the cursor's user.
        Columns that do not fit the width are left out whole, never cut mid-value.
        ``resorted``: the reader asked for another order (s, S, a header click): a cursor
        on the first row stays on the first row, at the top of the new order (it is
        what the reader sorted to see); one moved down follows its user.

        Every user is sorted (on raw figures) and measured (its figures' text, for the
        columns' widths), but cells are made only for the rows in view here; the other
        rows are made when they are drawn or read (:meth:`fill_row`)."""
        every = self.view.items("users")
        users = [u for u in every
                 if not is_fold(u) and matches(as_str(u.get("user")) or "", self.filter_text)]
        self._shown = len(users)
        ordered = sort_users(users, self.sort_column, self.sort_reverse)
        if not self.filter_text:  # the rest, folded into one row, always last
            ordered += [u for u in every if is_fold(u)]
        slo = self.view.slo
        fresh = self._cells_for != (slo, self.palette)
        if fresh:  # every cell made again
            self._cells_for, self._cells = (slo, self.palette), {}
        names = [as_str(u.get("user")) or "" for u in ordered if not is_fold(u)]
        widths = {
            c.key: max(len(header_label(c, c is self.sort_column, True)),
                       KIND_WIDTH.get(c.kind, 0),
                       self._widest(c, ordered, names, slo))
            for c in COLUMNS
        }
        visible, user_w = fit_columns(widths, available_cells(self, len(ordered)),
                                      self.sort_column.key)
        widths["user"] = user_w
        # the cursor's user and the view before new headings (a re-sort moves the ▲/▼)
        # clear the table, which puts the cursor on row 0
        current, at, scroll_y = self.cursor_key(), self.cursor_row, self.scroll_y
        if resorted and at == 0:
            current, scroll_y = None, 0.0
        self._headers(visible, widths)
        cols = tuple(COLUMNS.index(c) for c in visible)
        keys: list[str] = []
        want: dict[str, tuple[Mapping[str, Any], str]] = {}
        owners: dict[str, str] = {}
        seen: dict[str, int] = {}
        # cut together, so that names cut to the same label are cut in the middle instead
        labels = iter(self._labels(names, user_w))
        for u in ordered:
            user: str
            if is_fold(u):
                key, user, label = FOLD_ROW, FOLD_KEY, user_label(FOLD_LABEL, user_w)
            else:
                name = as_str(u.get("user")) or ""
                seen[name] = seen.get(name, 0) + 1
                key, user, label = row_key(name, seen[name]), name, next(labels)
            keys.append(key)
            want[key] = (u, label)
            owners[key] = user
        if fresh or cols != self._cols or self._keys is None:
            pending = set(keys)
        else:
            was = self._want
            pending = {k for k in keys if was.get(k) != want[k]}
            pending.update(k for k in self._pending if k in want)
        self._cols, self._want, self._users = cols, want, owners
        if len(self._cells) > len(want):  # users gone: their cells with them
            self._cells = {k: v for k, v in self._cells.items() if k in want}
        moved = False
        if self._keys is None or len(keys) != len(self._keys) \
                or set(keys) != set(self._keys):
            # other users (or other columns): the rows added again, their cells made
            # when drawn (a row shows nothing until then, and is never drawn before)
            self.clear()
            blank = [_NO_CELL] * len(cols)
            self._row_keys = {key: self.add_row(*blank, key=key) for key in keys}
            self._keys, self._shown_sig, self._pending = keys, {}, set(keys)
            if current is not None and current in owners:
                at = self.get_row_index(current)
            keep_view(self, at, scroll_y)  # a user gone: the row that took its place
            moved = True
        else:
            self._pending = pending
            if keys != self._keys:
                # the same users in another order (a re-sort, or figures that moved on):
                # the rows put in the new order, as DataTable.sort does
                made = self._row_keys
                self._row_locations = TwoWayDict({made[k]: i for i, k in enumerate(keys)})
                self._keys = keys
                if current is not None and current in owners:
                    at = self.get_row_index(current)
                # (the rows moved under the cursor, which stayed on its row number)
                self.scroll_to(y=scroll_y, animate=False, immediate=True)
                if at != self.cursor_row:
                    self.move_cursor(row=at, animate=False)
                moved = True
        if not moved and not self._pending:
            return
        # every drawn row is cached by this count: none drawn again without fill_row
        self._update_count += 1
        top = max(0, int(self.scroll_y))
        written = False
        for key in keys[top:top + max(0, self.size.height)]:
            written = self._fill(key) or written
        if moved or written:
            self.refresh()

    def fill_row(self, row_key: RowKey) -> None:
        key = row_key.value
        if isinstance(key, str) and key in self._pending:
            self._fill(key)

    def _fill(self, key: str) -> bool:
        """Write row ``key``'s cells that are not what it should show; whether any was."""
        self._pending.discard(key)
        got = self._want.get(key)
        if got is None:
            return False
        u, label = got
        entry = self._cells.get(key)
        if entry is None or entry.user != u:
            slo = self._cells_for[0] if self._cells_for is not None else self.view.slo
            entry = self._cells[key] = row_cells(u, self.view, self.palette, slo)
        if key == FOLD_ROW:
            first = Text(label, style=f"italic {self.palette.dim}")
        else:
            first = Text(label, no_wrap=True)
        rest = self._cols[1:]  # (the user column is always shown, first)
        sig = ((first.plain, str(first.style)), *(entry.sigs[i] for i in rest))
        was = self._shown_sig.get(key)
        if was == sig:
            return False
        self._shown_sig[key] = sig
        data = self._data.get(RowKey(key))
        if data is None:
            return False
        cells = (first, *(entry.cells[i] for i in rest))
        for i, (column, value) in enumerate(zip(self.columns, cells, strict=True)):
            if was is None or was[i] != sig[i]:
                data[column] = value
        return True

    def _widest(self, column: Column, ordered: Sequence[Mapping[str, Any]],
                names: list[str], slo: Slo) -> int:
        """The widest cell of ``column`` over every row, or less where that is no
        wider than the column's heading and :data:`KIND_WIDTH` (no cell made)."""
        if column.kind == "text":
            named = frozenset(names)
            if self._widest_for != named:
                self._widest_for = named
                self._widest_name = max((cell_len(user_label(n)) for n in named), default=0)
            fold = len(FOLD_LABEL) if any(is_fold(u) for u in ordered[-1:]) else 0
            return max(self._widest_name, fold)
        base = max(len(column.label), KIND_WIDTH.get(column.kind, 0))
        return widest_figure(column, ordered, slo, base)

    def _labels(self, names: list[str], width: int) -> list[str]:
        """``fmt.names(names, width)``, worked out again only for other names or another
        width: a name's label depends on the others, not on their order (a re-sort)."""
        key = (tuple(sorted(names)), width)
        if self._names_for != key:
            self._names_for = key
            self._names = dict(zip(names, fmt.names(names, width), strict=True))
        return [self._names[n] for n in names]

    def subtitle(self) -> Text:
        """"N users" (+ "others" when the proxy folded the rest into one row, "≈ K
        others" when the snapshot says how many were active recently; "top N" when it
        tracks no more), or "n of N users · filter: …" (the filter as plain text)."""
        every = self.view.items("users")
        total = sum(1 for u in every if not is_fold(u))
        if self.filter_text:
            t = Text(f"{self._shown} of {users(total)} · filter: ")
            t.append(printable(self.filter_text))
            return t
        if not any(is_fold(u) for u in every):
            return Text(users(total))
        top = self.view.num("top_users")
        lead = "top " if top is not None and total >= top else ""
        folded = self.view.num("users_untracked")
        if folded:
            return Text(f"{lead}{users(total)} + ≈{folded:.0f} others")
        return Text(f"{lead}{users(total)} + others")

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))
