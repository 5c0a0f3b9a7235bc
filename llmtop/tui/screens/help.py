"""The ``?`` screen: every key, what it does, and what the figures mean."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

REQUEST_KEY = ("enter", "on an active request: its fields, the engine's id among them")
"""The one panel key a user's detail has too (its table is of active requests)."""
KEYS: tuple[tuple[str, str], ...] = (
    ("q", "quit"),
    ("p", "pause / resume the display (the proxy keeps measuring)"),
    ("w", "cycle the window: 10 s → 60 s → 5 min → all"),
    ("s / S", "sort users by the next column / reverse the order"),
    ("/", "filter users (enter keeps the filter, escape clears it)"),
    ("r", "start recording (asks for a file on the proxy's machine) / stop"),
    ("tab", "move focus between panels (narrow: swap the two tables)"),
    ("enter", "on a user: that user's detail (escape goes back)"),
    REQUEST_KEY,
    ("d", "toggle dark / light"),
    ("?", "this help"),
)
DASHBOARD_ONLY = frozenset({"s / S", "/", "tab", "enter"})
"""Keys of the dashboard's panels, which do nothing in a user's detail (its enter, on a
request, is :data:`DETAIL_KEYS`')."""
DETAIL_KEYS: tuple[tuple[str, str], ...] = (
    ("esc / backspace", "back to the dashboard"),
    REQUEST_KEY,
)
REPLAY_PAUSE = ("p", "pause / resume the display (the replay plays on)")
"""A replay's ``p``: no proxy measures there, and the replay goes on (space pauses it)."""
REPLAY_KEYS: tuple[tuple[str, str], ...] = (
    # (all three in a request's fields too, which follow the replay: said on the row
    # that has the room, for another line would overflow the help at 80×24)
    ("space", "pause / resume the replay"),
    ("← / →", "seek 10 s back / forward"),
    ("+ / -", "replay faster / slower (all three in a request's fields too)"),
)
COLOURS = "Colours: green ≤ 80% of the SLO, yellow up to it, red over it. "
NO_COLOURS = ("NO_COLOR is set: over the SLO is bold and underlined, close to it "
              "(over 80%) underlined, within it plain. ")
NOTES = (
    "TTFT: request received → first content chunk sent (includes queueing). "
    "ITL: gap between tokens (a chunk of k tokens after g counts k × g/k). "
    "{colours}"
    "Goodput: requests meeting every SLO. Capacity: the largest concurrency that still "
    "met the SLO target. GPU 'busy' is the share of time memory was busy, not bandwidth; "
    "'bw' is DRAM bandwidth as % of peak (GPM)."
)


def help_table(replay: bool, detail: bool = False) -> Table:
    """The keys that apply: a replay's (no recording; seek, speed), and in a user's detail
    (``detail``) none of the dashboard's panel keys (sort, filter, tab, enter on a user)
    but the way back, and enter on a request."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    keys = tuple(REPLAY_PAUSE if k[0] == "p" else k
                 for k in KEYS if k[0] != "r") + REPLAY_KEYS if replay else KEYS
    if detail:
        keys = DETAIL_KEYS + tuple(k for k in keys if k[0] not in DASHBOARD_ONLY)
    for key, what in keys:
        table.add_row(Text(key), Text(what))
    return table


class HelpBox(VerticalScroll):
    """The help's box; a change of its size may make it scroll, or stop: the footer's
    "↑↓ scroll" comes and goes with that."""

    def on_resize(self) -> None:
        self.call_after_refresh(self.screen.refresh_bindings)


class HelpScreen(ModalScreen[None]):
    """Keys and definitions; any of escape, q or ? closes it.

    It has its own footer, over the dashboard's: with the help open, the main screen's
    keys (p pause, w window, r rec, …) do nothing — a modal screen takes every key — and
    q closes the help instead of quitting, so the footer says what applies: esc/q/?
    close, and ↑↓ scroll where the help is taller than its box."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss_help", "close", key_display="esc/q/?"),
        # the box (focused) scrolls on ↑/↓ and page keys itself, which the footer does not
        # show (the box's own bindings): this one says so, and pages on space
        Binding("space", "scroll_help", "scroll", key_display="↑↓"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > HelpBox {
        width: 90%; max-width: 100; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    #help-notes { margin-top: 1; }
    """

    def __init__(self, *, replay: bool = False, no_color: bool = False,
                 detail: bool = False) -> None:
        super().__init__()
        self.replay = replay
        self.no_color = no_color
        self.detail = detail
        """Opened from a user's detail: its keys, not the dashboard's."""

    def compose(self) -> ComposeResult:
        with HelpBox() as box:
            box.border_title = "llmtop keys"
            yield Static(help_table(self.replay, self.detail))
            notes = NOTES.replace("{colours}", NO_COLOURS if self.no_color else COLOURS)
            yield Static(Text(notes, style="dim"), id="help-notes")
        yield Footer(compact=True, show_command_palette=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "scroll_help":
            return self.query_one(HelpBox).max_scroll_y > 0
        return True

    def action_scroll_help(self) -> None:
        self.query_one(HelpBox).scroll_page_down()

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
