"""The main screen: header, warnings, capacity, latency and plots, GPU and engine, users
and active requests. Responsive: below 120 columns the plots and the requests table
give their room to the rest (breakpoint classes ``-narrow``/``-wide``, ``-short``/``-tall``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input

from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView
from llmtop.tui.stale_rows import StaleRows
from llmtop.tui.widgets.capacity import CapacityLine
from llmtop.tui.widgets.engine import EnginePanel
from llmtop.tui.widgets.gpu import GpuPanel
from llmtop.tui.widgets.header import HeaderBar, HeaderStatus
from llmtop.tui.widgets.latency import LatencyPanel
from llmtop.tui.widgets.plots import PlotsPanel
from llmtop.tui.widgets.requests import RequestsTable
from llmtop.tui.widgets.textbox import TextBox
from llmtop.tui.widgets.users import UsersTable
from llmtop.tui.widgets.warnings import WarningsBar


class Dashboard(Screen[None]):
    """Everything at a glance. The app calls :meth:`apply` after each fetch."""

    # Textual declares these as plain attributes, so they cannot be ClassVar-annotated here.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]  # noqa: RUF012

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("tab", "next_panel", "panels", show=True),
        Binding("shift+tab", "next_panel", "panels", show=False),
    ]

    class UserSelected(Message):
        """``enter`` on a user row: the app opens that user's detail."""

        def __init__(self, user: str) -> None:
            super().__init__()
            self.user = user

    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.header = HeaderBar(id="header")
        self.warnings = WarningsBar(id="warnings")
        self.capacity = CapacityLine(id="capacity")
        self.latency = LatencyPanel(id="latency", classes="panel")
        self.plots = PlotsPanel(id="plots", classes="panel")
        self.gpu = GpuPanel(id="gpu", classes="panel")
        self.engine = EnginePanel(id="engine", classes="panel")
        self.users = UsersTable(id="users")
        self.requests = RequestsTable(id="requests", title="active requests")
        self.filter_input = TextBox(placeholder="filter users…", id="filter")
        self.users_box = Vertical(id="users-box", classes="panel")
        self._active: Sequence[Mapping[str, Any]] = ()
        self._stale = StaleRows()

    def compose(self) -> ComposeResult:
        with Vertical(id="head"):
            yield self.header
            yield self.warnings
        yield self.capacity
        with Horizontal(id="top"):
            with Vertical(id="left"):
                yield self.latency
                yield self.engine
            yield self.plots
        yield self.gpu
        with Horizontal(id="tables"):
            with self.users_box:
                yield self.users
                yield self.filter_input
            yield self.requests
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # the titles apply() does not set; the latency's and the plots' are apply()'s
        # alone (set here too, they overwrote those of a first snapshot shown before this
        # ran: "latency" with no window, until the next refresh — with p, never)
        for panel, title in ((self.latency, "latency"), (self.plots, "last minutes")):
            if not panel.border_title:
                panel.border_title = title
        self.engine.border_title = "engine"
        self.gpu.border_title = "GPU"
        self.users_box.border_title = "users"
        self.users.focus()

    def on_resize(self, event: events.Resize) -> None:
        # the breakpoint classes (-short: the warnings bar's fewer lines) are set on a
        # resize, after the bar may have been measured without them (at start, too)
        self.call_after_refresh(self.warnings.refresh, layout=True)

    def apply(
        self,
        view: SnapView,
        palette: Palette,
        active: Sequence[Mapping[str, Any]],
        status: HeaderStatus,
        *,
        stale: StaleRows | None = None,
    ) -> None:
        """Show one snapshot (and the active requests, ``stale`` saying which of them the
        last fetch could not refresh) in every panel."""
        self._active, self._stale = active, stale or StaleRows()
        self.header.set_status(status)
        for panel in (
            self.header, self.warnings, self.capacity, self.latency,
            self.plots, self.gpu, self.engine,
        ):
            panel.show(view, palette)
        self.latency.border_title = f"latency · {fmt.window(status.window_s)}"
        self.users.show(view, palette)
        self.users_box.border_subtitle = self.users.subtitle()
        self.requests.show_requests(active, palette, view.slo.ttft_s, self._stale.label())

    def action_next_panel(self) -> None:
        """Wide: move focus to the next panel. Narrow, where only one table fits: swap
        the users table and the active requests."""
        if self.has_class("-narrow"):
            self.toggle_class("-show-requests")
            showing = self.requests if self.has_class("-show-requests") else self.users
            self.call_after_refresh(showing.focus)
        else:
            self.focus_next()

    # -- filter (``/``) ------------------------------------------------------------------------

    def open_filter(self) -> None:
        # narrow, with the requests shown in the users' place (tab): the users again, or
        # the box would take what is typed unseen, in the hidden users panel
        self.remove_class("-show-requests")
        self.add_class("-filtering")
        self.filter_input.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input is self.filter_input:
            self.users.set_filter(event.value)
            self.set_class(bool(event.value), "-filtered")
            self.users_box.border_subtitle = self.users.subtitle()
            self.requests.filter_text = event.value
            self.requests.show_requests(self._active, self.users.palette,
                                        self.users.view.slo.ttft_s, self._stale.label())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is self.filter_input:
            event.stop()
            self.remove_class("-filtering")
            self.users.focus()

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape" and self.filter_input.has_focus:
            event.stop()
            self.filter_input.value = ""
            self.remove_class("-filtering")
            self.users.focus()

    # -- drill-in --------------------------------------------------------------------------

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table is self.users:
            event.stop()
            user = self.users.user_for(event.row_key)
            if user is not None:
                self.post_message(self.UserSelected(user))
