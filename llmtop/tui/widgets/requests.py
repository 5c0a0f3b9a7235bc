"""Requests open right now, like processes in ``top``: id, user, model, state, age,
tokens so far and their rate. Oldest first — the stuck ones are the interesting ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import as_num, as_str, dicts
from llmtop.tui.widgets.users import matches

MAX_ROWS = 500
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("id", "id", False),
    ("user", "user", False),
    ("model", "model", False),
    ("state", "state", False),
    ("age", "age", True),
    ("tokens", "tokens", True),
    ("tps", "tok/s", True),
)


def request_cells(r: Mapping[str, Any], pal: Palette, ttft_slo: float | None) -> list[Text]:
    """The row for one active request. Client-chosen strings (id, user, model) are plain
    text, never markup, their control characters made visible, cut with "…" by cells."""
    state = printable(as_str(r.get("state")) or "?")
    age = as_num(r.get("age_s"))
    tokens = as_num(r.get("completion_tokens"))
    if tokens is None:
        tokens = as_num(r.get("tokens"))
    tps = as_num(r.get("tps"))
    state_style = pal.ok if state == "streaming" else pal.warn
    age_style = ""
    if state == "waiting" and ttft_slo is not None and age is not None and age > ttft_slo:
        age_style = pal.bad
    model = as_str(r.get("model"))
    return [
        Text(fmt.name(as_str(r.get("id")) or "", 14, "?"), no_wrap=True),
        Text(fmt.name(as_str(r.get("user")) or "", 20), no_wrap=True),
        Text(fmt.name(model or "", 24, fmt.NA), no_wrap=True,
             style="" if model else pal.dim),
        Text(state, style=state_style, no_wrap=True),
        Text(fmt.latency(age), style=age_style, justify="right"),
        Text(fmt.count(tokens), justify="right", style="" if tokens is not None else pal.dim),
        Text(fmt.rate(tps), justify="right", style="" if tps is not None else pal.dim),
    ]


def order_requests(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Oldest first; requests with no age last."""
    return sorted(rows, key=lambda r: -(as_num(r.get("age_s")) or -1.0))


class RequestsTable(DataTable[Text]):
    """Active requests. ``user`` (exact) limits it to one user; ``filter_text`` to users
    whose id contains it."""

    DEFAULT_CSS = """
    RequestsTable { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None, user: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.only_user = user
        self.exclude: frozenset[str] = frozenset()
        """Users whose requests are left out (the detail of "(others)": the tracked ones)."""
        self.filter_text = ""
        self._rendered: list[tuple[tuple[str, str], ...]] | None = None

    def show_requests(
        self, rows: Sequence[Mapping[str, Any]], palette: Palette, ttft_slo: float | None
    ) -> None:
        if not self.columns:
            for key, label, right in COLUMNS:
                self.add_column(Text(label, justify="right" if right else "left"), key=key)
        picked = [
            r for r in dicts(rows)  # a request that is not an object is left out
            if (self.only_user is None or as_str(r.get("user")) == self.only_user)
            and as_str(r.get("user")) not in self.exclude
            and matches(as_str(r.get("user")) or "", self.filter_text)
        ]
        ordered = order_requests(picked)
        table = [request_cells(r, palette, ttft_slo) for r in ordered[:MAX_ROWS]]
        signature = [tuple((c.plain, str(c.style)) for c in cells) for cells in table]
        if signature == self._rendered:
            return
        self._rendered = signature
        self.clear()
        for i, cells in enumerate(table):
            self.add_row(*cells, key=str(i))
        more = len(ordered) - len(table)
        sub = f"{len(ordered)} active" + (f" · {more} not shown" if more > 0 else "")
        self.border_subtitle = sub
