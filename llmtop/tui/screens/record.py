"""The ``r`` prompt: where to record, proposed as a timestamped file name."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from llmtop.tui.widgets.textbox import TextBox


class PathInput(TextBox):
    """The path box: Enter (Input's own submit) is shown in the prompt's footer as
    "start", the one key besides Escape that does something other than type."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "submit", "start", show=True),
    ]


class RecordPrompt(ModalScreen[str | None]):
    """Asks for a recording path (on the proxy's machine). Enter starts, escape cancels.

    It has its own footer, over the dashboard's: while the box has the focus, the main
    screen's keys (q quit, p pause, …) do not apply — typing q types a q — so the footer
    says what does: enter start, escape cancel."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel", show=True)]

    DEFAULT_CSS = """
    RecordPrompt { align: center middle; }
    RecordPrompt > Vertical {
        width: 80%; max-width: 90; height: auto;
        border: round $primary; background: $surface; padding: 0 1;
    }
    RecordPrompt Label { width: 100%; }
    #record-problem { display: none; color: $text-error; text-style: bold; }
    #record-problem.-shown { display: block; }
    """

    def __init__(self, proposed: str, problem: str | None = None) -> None:
        super().__init__()
        self.proposed = proposed
        self.problem = problem
        """Why the last try with ``proposed`` was refused (the prompt is open again)."""

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "record this session"
            yield Label("File on the proxy's machine, relative to its working directory "
                        "(.jsonl or .jsonl.gz); enter to start:")
            yield PathInput(value=self.proposed, id="record-path")
            yield Static(f"✖ {self.problem}" if self.problem else "", id="record-problem",
                         classes="-shown" if self.problem else "", markup=False)
        yield Footer(compact=True, show_command_palette=False)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.value != self.proposed:  # the name being fixed: the reason has done its job
            self.query_one("#record-problem", Static).remove_class("-shown")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        path = event.value.strip()
        self.dismiss(path or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
