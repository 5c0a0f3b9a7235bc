"""A DataTable whose columns all have the widths its owner gave them: it measures no cell.

Textual's DataTable measures every cell of every row added (``_update_dimensions``), and
for each cell updated in place measures it again and, when it got narrower, every cell of
its column (``_update_column_widths``), to size columns of automatic width. The users
and requests tables size their columns themselves (``add_column(width=...)``), so those
measurements change nothing: with 3,000 users they were most of a refresh's and of a
re-sort's time (a million ``measure`` calls a second, the keys waiting behind them).

A table may also leave rows out of view with cells that are not their latest, and make
them so in :meth:`FixedWidthTable.fill_row`: every read of a row's cells goes through
``get_row`` or ``get_cell`` (DataTable draws a row from ``get_row_at``), which call it
first, or through ``get_column`` or ``sort`` (DataTable's read its data directly), which
call it for every row first. The users table does: with 3,000 users whose figures move at
every refresh, making every row's cells was most of a refresh, for the 40 rows shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from rich.text import Text
from textual.geometry import Size
from textual.widgets import DataTable
from textual.widgets.data_table import CellKey, ColumnKey, RowKey


class FixedWidthTable(DataTable[Text]):
    """A DataTable that skips measuring cells while every column has a fixed width and
    no row has a label or an automatic height (else it does what DataTable does)."""

    def fill_row(self, row_key: RowKey) -> None:
        """Make the row's cells its latest, written straight into the table's data (no
        refresh: it is called while the row is drawn, or read). Here, nothing: every
        row's cells are always its latest. A table that overrides it must bump
        ``_update_count`` whenever what a row should show changes (the drawn rows are
        cached by that count), so that no row is drawn again without coming here."""

    def get_row(self, row_key: RowKey | str) -> list[Text]:
        self.fill_row(row_key if isinstance(row_key, RowKey) else RowKey(row_key))
        return super().get_row(row_key)

    def get_cell(self, row_key: RowKey | str, column_key: ColumnKey | str) -> Text:
        self.fill_row(row_key if isinstance(row_key, RowKey) else RowKey(row_key))
        return super().get_cell(row_key, column_key)

    def _fill_every_row(self) -> None:
        for row_key in list(self._data):
            self.fill_row(row_key)

    def get_column(self, column_key: ColumnKey | str) -> Iterable[Text]:
        # (DataTable's reads the data directly: a row never drawn gave its empty cells)
        self._fill_every_row()
        return super().get_column(column_key)

    def sort(self, *columns: ColumnKey | str, key: Callable[[Any], Any] | None = None,
             reverse: bool = False) -> Self:
        # (DataTable's sorts the data directly: a row never drawn sorted as empty)
        self._fill_every_row()
        return super().sort(*columns, key=key, reverse=reverse)

    def _fixed_widths(self) -> bool:
        return all(not column.auto_width for column in self.columns.values())

    def _update_column_widths(self, updated_cells: set[CellKey]) -> None:
        if self._fixed_widths():
            return  # a cell's width sizes no column
        super()._update_column_widths(updated_cells)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        new_rows = list(new_rows)
        rows = self.rows
        if not self._fixed_widths() or any(
            (row := rows.get(key)) is not None and (row.auto_height or row.label is not None)
            for key in new_rows
        ):
            super()._update_dimensions(new_rows)
            return
        self._set_virtual_size()

    def relabel(self, columns: Mapping[str, tuple[Text, int]]) -> None:
        """New headings and widths for the columns already there, in the same order (a
        re-sort moves the ▲/▼), the rows kept: ``clear(columns=True)`` would have every
        row added (and drawn) again."""
        for key, (label, width) in columns.items():
            column = self.columns[ColumnKey(key)]
            column.label, column.width = label, width
        # every rendered cell, row and line is cached by this count: drawn anew
        self._update_count += 1
        self._set_virtual_size()
        self.refresh()

    def _set_virtual_size(self) -> None:
        """What DataTable's ``_update_dimensions`` ends with: the scrollable size."""
        width = sum(column.get_render_width(self) for column in self.columns.values())
        header = self.header_height if self.show_header else 0
        self.virtual_size = Size(width + self._row_label_column_width,
                                 self._total_row_height + header)
