"""The users table: who is causing load and who is unhappy. Sortable (``s`` cycles the
column, ``S`` reverses it, or click a header), filterable (``/``); ``enter`` opens a user."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

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


def patch_cells(table: FixedWidthTable, row_keys: Sequence[str], columns: Sequence[str],
                old: Sequence[CellSig], new: Sequence[CellSig],
                cells: Sequence[Sequence[Text]]) -> None:
    """The same rows as before, in the same order, some figures changed: only the cells
    that changed are written, in place. Clearing and adding every row again made the
    table measure every cell anew at each refresh (2,000 users: most of a refresh's
    time, the keys waiting behind it), and lost the cursor and the view."""
    table.write_cells(
        (key, column, value)
        for key, was, now, row in zip(row_keys, old, new, cells, strict=True) if was != now
        for column, a, b, value in zip(columns, was, now, row, strict=True) if a != b)


PATCH_PER_ROW = 3
"""Writing a cell in place costs about a third of adding a whole row again: past this
many changed cells a row (on average), a table is rebuilt rather than patched."""


def cheap_reorder(old: Sequence[tuple[str, CellSig]], new: Sequence[tuple[str, CellSig]]) -> bool:
    """Whether rows ``old`` (row key, cells) become ``new`` more cheaply by writing the
    changed cells and sorting than by clearing and adding every row: the same row keys,
    and few cells changed."""
    was = dict(old)
    if len(was) != len(old) or was.keys() != {k for k, _ in new}:
        return False
    budget = PATCH_PER_ROW * len(new)
    for key, sig in new:
        before = was[key]
        if before != sig:
            budget -= sum(a != b for a, b in zip(before, sig, strict=True))
            if budget < 0:
                return False
    return True


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


def cell(column: Column, user: Mapping[str, Any], view: SnapView, pal: Palette,
         slo: Slo | None = None) -> Text:
    """One cell of ``user``'s row. ``slo``: ``view.slo``, when the caller has it already
    (it is built anew at each ``view.slo``: once per table, not once per cell)."""
    if column.kind == "text":
        name = FOLD_LABEL if is_fold(user) else as_str(user.get(column.key)) or ""
        return Text(user_label(name), no_wrap=True)
    if slo is None:
        slo = view.slo
    v = as_num(user.get(column.key))
    if column.kind == "latency":
        threshold = slo.for_metric(column.slo_metric or "")
        # Merged from proxies without per-user histograms: an upper bound, marked "≤".
        bound = "≤" if user.get("approximate") is True and v is not None else ""
        return Text(bound + fmt.latency_against(v, threshold), style=pal.latency(v, threshold),
                    justify="right")
    if column.kind == "attainment":
        return Text(fmt.attainment(v, slo.target),
                    style=pal.attainment(v, slo.target),
                    justify="right")
    text = fmt.rate(v) if column.kind == "rate" else fmt.count(v)
    return Text(text, style="" if v is not None else pal.dim, justify="right")


@dataclass(frozen=True, slots=True)
class RowCells:
    """One user's cells in every column (:data:`COLUMNS`), each one's width and what it
    shows (text and style), made once for as long as the user's figures do not change."""

    user: Mapping[str, Any]
    cells: tuple[Text, ...]
    lens: tuple[int, ...]
    sigs: tuple[tuple[str, str], ...]


def row_cells(user: Mapping[str, Any], view: SnapView, pal: Palette, slo: Slo) -> RowCells:
    cells = tuple(cell(c, user, view, pal, slo) for c in COLUMNS)
    return RowCells(user, cells, tuple(c.cell_len for c in cells),
                    tuple((c.plain, str(c.style)) for c in cells))


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
        self._rendered: list[tuple[str, CellSig]] | None = None
        self._header: object = None
        self.shown_columns: list[Column] = list(COLUMNS)
        """The columns shown at the current width (``s`` cycles through these)."""
        self._shown = 0
        self._cells: dict[str, RowCells] = {}
        """The last cells made for each user id, kept while its figures, the SLOs and the
        palette stay the same: a re-sort, and a refresh where few figures moved, make
        only the rows that changed."""
        self._cells_for: tuple[Slo, Palette] | None = None
        self._names_for: tuple[tuple[str, ...], int] | None = None
        self._names: dict[str, str] = {}

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
        self._rendered = None

    def redraw(self, *, resorted: bool = False) -> None:
        """Rebuild the rows (only when something visible changed); keep the cursor's user.
        Columns that do not fit the width are left out whole, never cut mid-value.
        ``resorted``: the reader asked for another order (s, S, a header click): a cursor
        on the first row stays on the first row, at the top of the new order (it is
        what the reader sorted to see); one moved down follows its user."""
        every = self.view.items("users")
        users = [u for u in every
                 if not is_fold(u) and matches(as_str(u.get("user")) or "", self.filter_text)]
        self._shown = len(users)
        ordered = sort_users(users, self.sort_column, self.sort_reverse)
        if not self.filter_text:  # the rest, folded into one row, always last
            ordered += [u for u in every if is_fold(u)]
        table = self._row_cells(ordered)
        widths = {
            c.key: max(len(header_label(c, c is self.sort_column, True)),
                       KIND_WIDTH.get(c.kind, 0),
                       max((row.lens[i] for row in table), default=0))
            for i, c in enumerate(COLUMNS)
        }
        visible, user_w = fit_columns(widths, available_cells(self, len(table)),
                                      self.sort_column.key)
        widths["user"] = user_w
        # the cursor's user and the view before new headings (a re-sort moves the ▲/▼)
        # clear the table, which puts the cursor on row 0
        current, at, scroll_y = self.cursor_key(), self.cursor_row, self.scroll_y
        if resorted and at == 0:
            current, scroll_y = None, 0.0
        self._headers(visible, widths)
        shown = [COLUMNS.index(c) for c in visible]
        rows: list[tuple[str, str, list[Text]]] = []
        signature: list[tuple[str, CellSig]] = []
        seen: dict[str, int] = {}
        # cut together, so that names cut to the same label are cut in the middle instead
        labels = iter(self._labels([as_str(u.get("user")) or "" for u in ordered
                                    if not is_fold(u)], user_w))
        rest = shown[1:]  # (the user column is always shown, first)
        for u, entry in zip(ordered, table, strict=True):
            name = as_str(u.get("user")) or ""
            user: str
            if is_fold(u):
                key, user = FOLD_ROW, FOLD_KEY
                first = Text(user_label(FOLD_LABEL, user_w), style=f"italic {self.palette.dim}")
            else:
                seen[name] = seen.get(name, 0) + 1
                key, user = row_key(name, seen[name]), name
                first = Text(next(labels), no_wrap=True)
            rows.append((key, user, [first, *(entry.cells[i] for i in rest)]))
            signature.append(
                (key, ((first.plain, str(first.style)), *(entry.sigs[i] for i in rest))))
        if signature == self._rendered:
            return
        old = self._rendered
        if old is not None and [k for k, _ in old] == [k for k, _ in signature]:
            # the same users in the same order (a new header has set _rendered to None)
            patch_cells(self, [k for k, _ in signature], [c.key for c in visible],
                        [cs for _, cs in old], [cs for _, cs in signature],
                        [cells for _, _, cells in rows])
            self._rendered = signature
            return
        if old is not None and len(old) == len(signature) == self.row_count \
                and cheap_reorder(old, signature):
            # the same users in another order (a re-sort, or figures that moved on), few
            # cells changed: those written in place, then the rows put in the new order
            self._reorder(old, signature, [c.key for c in visible],
                          [cells for _, _, cells in rows])
            self._users = {key: user for key, user, _ in rows}
            self._rendered = signature
            if current is not None and current in self._users:
                at = self.get_row_index(current)
            # (the rows moved under the cursor, which stayed on its row number)
            self.scroll_to(y=scroll_y, animate=False, immediate=True)
            if at != self.cursor_row:
                self.move_cursor(row=at, animate=False)
            return
        self.clear()
        self._users = {}
        for key, user, cells in rows:
            self.add_row(*cells, key=key)
            self._users[key] = user
        self._rendered = signature
        if current is not None and current in self._users:
            at = self.get_row_index(current)
        keep_view(self, at, scroll_y)  # a user gone: the row that took its place

    def _reorder(self, old: Sequence[tuple[str, CellSig]], new: Sequence[tuple[str, CellSig]],
                 columns: Sequence[str], cells: Sequence[Sequence[Text]]) -> None:
        """The rows ``old`` (row key, what it shows) as ``new``: the same keys in
        another order. Each row's changed cells are written, then the rows sorted."""
        was = dict(old)
        keys = [k for k, _ in new]
        patch_cells(self, keys, columns, [was[k] for k in keys], [sig for _, sig in new],
                    cells)
        # DataTable.sort hands its key function the cells of the columns named: each
        # row's first cell (a Text of its own, never shared) tells the row
        rank = {id(self.get_cell(k, columns[0])): i for i, k in enumerate(keys)}
        self.sort(columns[0], key=lambda first: rank[id(first)])

    def _labels(self, names: list[str], width: int) -> list[str]:
        """``fmt.names(names, width)``, worked out again only for other names or another
        width: a name's label depends on the others, not on their order (a re-sort)."""
        key = (tuple(sorted(names)), width)
        if self._names_for != key:
            self._names_for = key
            self._names = dict(zip(names, fmt.names(names, width), strict=True))
        return [self._names[n] for n in names]

    def _row_cells(self, ordered: Sequence[Mapping[str, Any]]) -> list[RowCells]:
        """Each user's cells: made again only for a user whose figures changed (or all of
        them when the SLOs or the palette did)."""
        slo = self.view.slo
        if self._cells_for != (slo, self.palette):
            self._cells_for, self._cells = (slo, self.palette), {}
        old: dict[str, RowCells] = self._cells
        new: dict[str, RowCells] = {}
        out = []
        for u in ordered:
            name = FOLD_KEY if is_fold(u) else as_str(u.get("user")) or ""
            entry = old.get(name)
            if entry is None or entry.user != u:
                entry = row_cells(u, self.view, self.palette, slo)
            new.setdefault(name, entry)
            out.append(entry)
        self._cells = new
        return out

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
