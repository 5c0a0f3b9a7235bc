"""The ``?`` screen: every key, what it does, and what the figures mean."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("q", "quit"),
    ("p", "pause / resume the display (the proxy keeps measuring)"),
    ("w", "cycle the window: 10 s → 60 s → 5 min → all"),
    ("s / S", "sort users by the next column / reverse the order"),
    ("/", "filter users (enter keeps the filter, escape clears it)"),
    ("r", "start recording (asks for a file on the proxy's machine) / stop"),
    ("tab", "move focus between panels"),
    ("enter", "on a user: that user's detail (escape goes back)"),
    ("d", "toggle dark / light"),
    ("?", "this help"),
)
REPLAY_KEYS: tuple[tuple[str, str], ...] = (
    ("space", "pause / resume the replay"),
    ("← / →", "seek 10 s back / forward"),
    ("+ / -", "replay faster / slower"),
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


def help_table(replay: bool) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    keys = tuple(k for k in KEYS if k[0] != "r") + REPLAY_KEYS if replay else KEYS
    for key, what in keys:
        table.add_row(Text(key), Text(what))
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and definitions; any of escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss_help", "close", show=True),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 100; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    #help-notes { margin-top: 1; }
    """

    def __init__(self, *, replay: bool = False, no_color: bool = False) -> None:
        super().__init__()
        self.replay = replay
        self.no_color = no_color

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "llmtop keys"
            yield Static(help_table(self.replay))
            notes = NOTES.replace("{colours}", NO_COLOURS if self.no_color else COLOURS)
            yield Static(Text(notes, style="dim"), id="help-notes")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
