"""Requests open right now, like processes in ``top``: id, user, model, state, age,
tokens so far and their rate. Oldest first — the stuck ones are the interesting ones.

In one user's detail there is no user column (every row would say the same name) and
the state is the TTFT column's: a request that has its first token shows its TTFT, one
that has not says "waiting" there (see :data:`ONE_USER`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import as_num, as_str, dicts, request_key
from llmtop.tui.widgets.fixedtable import FixedWidthTable
from llmtop.tui.widgets.users import (
    CellSig,
    available_cells,
    keep_view,
    matches,
    text_width,
)

MAX_ROWS = 500
LABELS: dict[str, tuple[str, bool]] = {
    "id": ("id", False),
    "user": ("user", False),
    "model": ("model", False),
    "state": ("state", False),
    "ttft": ("TTFT", True),
    "age": ("age", True),
    "tokens": ("tokens", True),
    "tps": ("tok/s", True),
}
"""Every column's heading and whether it is right-aligned."""
TEXT_WIDTH = {"id": 14, "user": 20, "model": 24}
"""The most cells a text column takes (its values are cut with "…" beyond)."""
TEXT_MIN = {"id": 6, "user": 8, "model": 8}
"""What a text column gives up room down to before a column is dropped."""
FIGURE_WIDTH = {"age": 7, "tokens": 7, "tps": 6, "ttft": 7}
"""Room a figure column keeps for its values whatever they are now (``fmt.latency``'s
"41.0 ms", "999,999", "waiting"), so that the columns shown do not come and go as
figures change."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A table's columns: ``columns`` in the order shown; ``keep``, which stay when not
    all fit (the first the longest); ``grow``, which text columns get room back first."""

    columns: tuple[str, ...]
    keep: tuple[str, ...]
    grow: tuple[str, ...]


SEVERAL_USERS = Layout(
    columns=("id", "user", "model", "state", "age", "tokens", "tps"),
    # whose request and how old it is first (the stuck ones are the interesting ones),
    # the request id last
    keep=("user", "age", "state", "tokens", "model", "tps", "id"),
    grow=("user", "model", "id"),
)
"""The dashboard's table: every user's requests."""
ONE_USER = Layout(
    columns=("id", "model", "ttft", "age", "tokens", "tps"),
    keep=("age", "ttft", "tokens", "model", "tps", "id"),
    grow=("model", "id"),
)
"""One user's detail: no user column (the same name on every row), and the TTFT column
in the state's place ("waiting" until the first token); at 40 columns age, TTFT,
tokens and model fit."""
FOLD = Layout(
    columns=("id", "user", "model", "ttft", "age", "tokens", "tps"),
    keep=("user", "age", "ttft", "tokens", "model", "tps", "id"),
    grow=("user", "model", "id"),
)
"""The detail of "(others)": several users' requests, so the user column stays."""
COLUMNS: tuple[tuple[str, str, bool], ...] = tuple(
    (key, *LABELS[key]) for key in SEVERAL_USERS.columns)
"""The dashboard's columns: key, heading, right-aligned."""
KEEP = SEVERAL_USERS.keep
GROW = SEVERAL_USERS.grow
PAD = 1
"""The table's cell padding on each side of a column."""


def request_cells(
    r: Mapping[str, Any], pal: Palette, ttft_slo: float | None,
    widths: Mapping[str, int] = TEXT_WIDTH,
) -> dict[str, Text]:
    """The row for one active request, every column (:data:`LABELS`). Client-chosen
    strings (id, user, model) are plain text, never markup, their control characters
    made visible and cut with "…" to ``widths`` cells."""
    state = printable(as_str(r.get("state")) or "?")
    age = as_num(r.get("age_s"))
    ttft = as_num(r.get("ttft_s"))
    tokens = as_num(r.get("completion_tokens"))
    if tokens is None:
        tokens = as_num(r.get("tokens"))
    tps = as_num(r.get("tps"))
    state_style = pal.ok if state == "streaming" else pal.warn
    age_style = ""
    if state == "waiting" and ttft_slo is not None and age is not None and age > ttft_slo:
        age_style = pal.bad
    if ttft is not None:
        ttft_cell = Text(fmt.latency_against(ttft, ttft_slo), style=pal.latency(ttft, ttft_slo),
                         justify="right", no_wrap=True)
    else:  # no first token yet: the state says why (waiting), in the state's colours
        ttft_cell = Text(state, style=age_style or state_style, justify="right",
                         no_wrap=True)
    model = as_str(r.get("model"))
    return {
        "id": Text(fmt.name(as_str(r.get("id")) or "", widths["id"], "?"), no_wrap=True),
        "user": Text(fmt.name(as_str(r.get("user")) or "", widths["user"]), no_wrap=True),
        "model": Text(fmt.name(model or "", widths["model"], fmt.NA), no_wrap=True,
                      style="" if model else pal.dim),
        "state": Text(state, style=state_style, no_wrap=True),
        "ttft": ttft_cell,
        "age": Text(fmt.latency(age), style=age_style, justify="right"),
        "tokens": Text(fmt.count(tokens), justify="right",
                       style="" if tokens is not None else pal.dim),
        "tps": Text(fmt.rate(tps), justify="right", style="" if tps is not None else pal.dim),
    }


def request_widths(r: Mapping[str, Any], ttft_slo: float | None,
                   names: dict[tuple[str, str], int]) -> dict[str, int]:
    """Each cell's width in ``request_cells(r, ..., TEXT_WIDTH)``, without making its
    cells (every column's width is the widest of up to 500 rows: they were made twice at
    every refresh, once to be measured). ``names``: the widths of the client-chosen
    strings met so far (id, user, model and state), kept from one refresh to the next."""

    def width(key: str, s: str) -> int:
        got = names.get((key, s))
        if got is None:
            if key == "state":
                got = cell_len(printable(s))
            else:
                empty = {"id": "?", "model": fmt.NA}.get(key, "(empty)")
                got = cell_len(fmt.name(s, TEXT_WIDTH[key], empty))
            names[(key, s)] = got
        return got

    state = as_str(r.get("state")) or "?"
    ttft = as_num(r.get("ttft_s"))
    tokens = as_num(r.get("completion_tokens"))
    if tokens is None:
        tokens = as_num(r.get("tokens"))
    return {
        "id": width("id", as_str(r.get("id")) or ""),
        "user": width("user", as_str(r.get("user")) or ""),
        "model": width("model", as_str(r.get("model")) or ""),
        "state": width("state", state),
        "ttft": (text_width(fmt.latency_against(ttft, ttft_slo)) if ttft is not None
                 else width("state", state)),
        "age": text_width(fmt.latency(as_num(r.get("age_s")))),
        "tokens": text_width(fmt.count(tokens)),
        "tps": text_width(fmt.rate(as_num(r.get("tps")))),
    }


def fit_columns(natural: Mapping[str, int], avail: int,
                layout: Layout = SEVERAL_USERS) -> dict[str, int]:
    """The columns to show in ``avail`` cells and their widths (``layout``'s order).
    ``natural`` is each column's width with every value whole (header included, padding
    not). Text columns give up room down to :data:`TEXT_MIN` before any column is
    dropped; columns are then dropped whole, in reverse ``layout.keep`` order; the room
    left goes back to the text columns (``layout.grow``), up to their natural width."""
    least = {k: min(w, TEXT_MIN.get(k, w)) for k, w in natural.items()}
    budget = avail
    keep: set[str] = set()
    order = [k for k in layout.keep if k in natural]
    for key in order:
        need = least[key] + 2 * PAD
        if need <= budget or not keep:  # the first column stays, cut if need be
            keep.add(key)
            budget -= need
    widths = {k: least[k] for k in keep}
    for key in layout.grow:
        if key in keep and budget > 0:
            more = min(budget, natural[key] - widths[key])
            widths[key] += more
            budget -= more
    if budget < 0:  # not even the first column fits: it takes what there is
        first = order[0]
        widths[first] = max(1, widths[first] + budget)
    return {key: widths[key] for key in layout.columns if key in keep}


def order_requests(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Oldest first; requests with no age last."""
    return sorted(rows, key=lambda r: -(as_num(r.get("age_s")) or -1.0))


class RequestsTable(FixedWidthTable):
    """Active requests. ``user`` (exact) limits it to one user; ``filter_text`` to users
    whose id contains it (then said in the title, and "n of N active" below). ``layout``
    says the columns (by default :data:`ONE_USER` for one user's table, else
    :data:`SEVERAL_USERS`). Columns that do not fit the width
    are left out whole, the least useful first (``layout.keep``); ids, users and models
    are cut with "…". ``enter`` on a row posts :class:`RequestSelected` with that row
    (the app opens its fields: the engine's id and all)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "request", show=True),
    ]

    DEFAULT_CSS = """
    RequestsTable { height: 1fr; overflow-x: hidden; }
    """

    class RequestSelected(Message):
        """``enter`` on a request row: the app opens that request's fields."""

        def __init__(self, row: Mapping[str, Any]) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None, user: str | None = None,
                 layout: Layout | None = None, title: str = "") -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.only_user = user
        self.columns_layout = layout or (SEVERAL_USERS if user is None else ONE_USER)
        self.exclude: frozenset[str] = frozenset()
        """Users whose requests are left out (the detail of "(others)": the tracked ones)."""
        self.filter_text = ""
        self.title = title
        """The border's title (plain text); a word that the rows are old (not refreshed)
        follows it."""
        self.border_title = Text(title)
        self.shown_columns: dict[str, int] = {}
        """The columns shown at the current width, and their widths."""
        self._last: tuple[Sequence[Mapping[str, Any]], Palette, float | None,
                          str | None] | None = None
        self._titled: tuple[str, str, str | None, str] | None = None
        self._subtitle: str | None = None
        self._keys: list[tuple[str | None, str | None]] | None = None
        """The shown requests' keys, in row order."""
        self._want: list[tuple[Mapping[str, Any], str, str]] = []
        """What each row should show: its request, its user's and its model's labels."""
        self._made_for: tuple[Palette, float | None, tuple[tuple[str, int], ...],
                              tuple[tuple[str, int], ...]] | None = None
        """What the cells are made with: palette, TTFT SLO, text widths, the columns."""
        self._pending: set[int] = set()
        """Rows whose cells may not be what ``_want`` says (made when drawn or read)."""
        self._shown_sig: dict[int, CellSig] = {}
        """What each row's cells in the table show now (text and style)."""
        self._widths: dict[tuple[str, str], int] = {}
        """The widths of the ids, users, models and states met (:func:`request_widths`)."""
        self._labels: dict[str, tuple[tuple[frozenset[str], int, str], dict[str, str]]] = {}
        """The last labels of the users and the models (:meth:`_names`)."""
        self._rows: list[Mapping[str, Any]] = []
        """The requests shown, in row order (row key ``str(i)`` is ``_rows[i]``)."""

    def request_for(self, row_key: object) -> Mapping[str, Any] | None:
        """The request shown on the row with this key, as its latest row carries it."""
        key = getattr(row_key, "value", row_key)
        if not isinstance(key, str) or not key.isdigit() or int(key) >= len(self._rows):
            return None
        return self._rows[int(key)]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table is self:
            event.stop()
            row = self.request_for(event.row_key)
            if row is not None:
                self.post_message(self.RequestSelected(row))

    def on_resize(self) -> None:
        if self._last is not None:
            self.show_requests(*self._last)

    def _names(self, strings: list[str], key: str, width: int, empty: str) -> list[str]:
        """``fmt.names(strings, width, empty)``, worked out again only for another set of
        strings or width: a string's label depends on the others, not on their order
        or how many times each comes (the same few users on 500 rows)."""
        kept = self._labels.get(key)
        named = (frozenset(strings), width, empty)
        if kept is None or kept[0] != named:
            unique = list(dict.fromkeys(strings))
            kept = self._labels[key] = (named, dict(zip(unique, fmt.names(unique, width, empty),
                                                        strict=True)))
        return [kept[1][s] for s in strings]

    def _resize_rows(self, rows: int, columns: int) -> None:
        """``rows`` rows, keyed by their number: those past it taken off the end, new
        ones (empty, to be written) added at the end."""
        for i in range(self.row_count - 1, rows - 1, -1):
            self.remove_row(str(i))
        blank = [Text("")] * columns
        for i in range(self.row_count, rows):
            self.add_row(*blank, key=str(i))

    def _set_title(self, stale: str | None, palette: Palette) -> None:
        titled = (self.title, self.filter_text, stale, palette.warn)
        if titled == self._titled:
            return
        # where the table has no frame (narrow), the classes give it a top line for this
        self.set_class(bool(stale), "-stale")
        self.set_class(bool(self.filter_text), "-filtered")
        self._titled = titled
        title = Text(self.title)
        if self.filter_text:
            # (QA: the `/` filter cut this list to the matching users' requests with no
            # word here, narrow not even the users panel's "filter: …": read as all of them)
            title.append(" · user filter: ")
            title.append(printable(self.filter_text), style="bold")
        if stale:
            title.append(" · ")
            title.append(printable(stale), style=f"bold {palette.warn}")
        self.border_title = title

    def show_requests(
        self, rows: Sequence[Mapping[str, Any]], palette: Palette, ttft_slo: float | None,
        stale: str | None = None,
    ) -> None:
        """Show ``rows``; ``stale``, when set, says why they are the last ones had, not
        the latest (in the title, in the warning colour)."""
        self._last = (rows, palette, ttft_slo, stale)
        self._set_title(stale, palette)
        mine = [
            r for r in dicts(rows)  # a request that is not an object is left out
            if (self.only_user is None or as_str(r.get("user")) == self.only_user)
            and as_str(r.get("user")) not in self.exclude
        ]
        picked = [r for r in mine if matches(as_str(r.get("user")) or "", self.filter_text)]
        ordered = order_requests(picked)[:MAX_ROWS]
        # the request under the cursor, followed to its new row below
        was = self.request_for(str(self.cursor_row)) if self.row_count else None
        # before the early return below: the cells may be the same while fields the table
        # does not show (the engine's id) have moved on
        self._rows = ordered
        layout = self.columns_layout
        if len(self._widths) > 4 * len(ordered) + 256:  # ids that have come and gone
            self._widths = {}
        measured = [request_widths(r, ttft_slo, self._widths) for r in ordered]
        natural = {
            key: max([len(LABELS[key][0]), FIGURE_WIDTH.get(key, 0),
                      *(row[key] for row in measured)])
            for key in layout.columns
        }
        shown = fit_columns(natural, available_cells(self, len(ordered)), layout)
        clip = {**TEXT_WIDTH, **{k: w for k, w in shown.items() if k in TEXT_WIDTH}}
        labels = {key: self._names([as_str(r.get(key)) or "" for r in ordered], key,
                                   clip[key], empty)
                  for key, empty in (("user", "(empty)"), ("model", fmt.NA))}
        # cut together: names cut to the same label are cut in the middle instead
        want = list(zip(ordered, labels["user"], labels["model"], strict=True))
        keys = [request_key(r) for r in ordered]
        more = len(picked) - len(want)
        sub = (f"{len(picked)} of {len(mine)} active" if self.filter_text
               else f"{len(picked)} active") + (f" · {more} not shown" if more > 0 else "")
        if sub != self._subtitle:  # (setting it redraws the table, changed or not)
            self._subtitle = self.border_subtitle = sub
        made_for = (palette, ttft_slo, tuple(clip.items()), tuple(shown.items()))
        old = self._want
        if made_for != self._made_for:
            pending = set(range(len(want)))
        else:
            pending = {i for i, w in enumerate(want) if i >= len(old) or old[i] != w}
            pending.update(i for i in self._pending if i < len(want))
        self._made_for, self._want = made_for, want
        cursor, scroll_y = self.cursor_row, self.scroll_y
        if was is not None and request_key(was) in keys:
            cursor = keys.index(request_key(was))
        moved = False
        if self.shown_columns != shown or not self.columns:
            self.clear(columns=True)
            for key, width in shown.items():
                label, right = LABELS[key]
                self.add_column(Text(label, justify="right" if right else "left"),
                                key=key, width=width)
            self.shown_columns = shown
            self._shown_sig = {}
            self._resize_rows(len(want), len(shown))
            keep_view(self, cursor, scroll_y)
            pending, moved = set(range(len(want))), True
        elif keys != self._keys:
            # requests that started or ended: a row is a place (its key its number),
            # so the rows there stay and take their new cells, rows are added or taken
            # off at the end. Clearing and adding 500 rows again at every request that
            # started or ended was most of a refresh.
            if len(want) != self.row_count:
                self._resize_rows(len(want), len(shown))
                self._shown_sig = {i: v for i, v in self._shown_sig.items() if i < len(want)}
            if self.row_count and cursor != self.cursor_row:
                self.move_cursor(row=min(cursor, self.row_count - 1), animate=False)
            moved = True
        self._keys, self._pending = keys, pending
        if not moved and not pending:
            return
        # every drawn row is cached by this count: none drawn again without fill_row
        self._update_count += 1
        top = max(0, int(self.scroll_y))
        written = False
        for i in range(top, min(len(want), top + max(0, self.size.height))):
            written = self._fill(i) or written
        if moved or written:
            self.refresh()

    def fill_row(self, row_key: RowKey) -> None:
        key = row_key.value
        if isinstance(key, str) and key.isdigit() and int(key) in self._pending:
            self._fill(int(key))

    def _fill(self, i: int) -> bool:
        """Write row ``i``'s cells that are not what it should show; whether any was.
        Only the rows drawn (or read) are made: 500 rows whose ages all move, ~20 shown."""
        self._pending.discard(i)
        if i >= len(self._want) or self._made_for is None:
            return False
        r, user, model = self._want[i]
        palette, ttft_slo, clip, shown = self._made_for
        cells = request_cells(r, palette, ttft_slo, dict(clip))
        cells["user"] = Text(user, style=cells["user"].style, no_wrap=True)
        cells["model"] = Text(model, style=cells["model"].style, no_wrap=True)
        row = [cells[key] for key, _ in shown]
        sig = tuple((c.plain, str(c.style)) for c in row)
        was = self._shown_sig.get(i)
        if was == sig:
            return False
        self._shown_sig[i] = sig
        data = self._data.get(RowKey(str(i)))
        if data is None:
            return False
        for n, (column, value) in enumerate(zip(self.columns, row, strict=True)):
            if was is None or was[n] != sig[n]:
                data[column] = value
        return True
