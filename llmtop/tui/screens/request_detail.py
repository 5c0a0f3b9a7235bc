"""The ``enter`` modal on an active request: every field its row carries, the engine's own
id of it first among them (``upstream_id``: what to grep the engine's logs for when a
request sits at "waiting 40 s").

Nothing is fetched for it: the rows come with every snapshot, and the app hands each new
list to :meth:`RequestDetail.follow`. A request that is no longer in the list has ended:
the modal says "finished" and keeps its last figures rather than closing under the
reader (who may be copying the id). A list that could not be fetched says nothing of
whether it has: the modal then says that it could not refresh, with the last figures."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import as_num, as_str, dicts, request_key
from llmtop.tui.stale_rows import StaleRows

NOT_NAMED = "not named yet"
"""The engine's id while the request is open and neither the response head nor the body
has named it (it can come later in the stream)."""
NONE = "none"
"""The engine's id of a request that ended without one being named."""
FINISHED = "finished"
NOT_REFRESHED = "could not refresh"
REPLAY_BINDINGS: tuple[Binding, ...] = (
    Binding("space", "app.replay_pause", "play/pause"),
    Binding("left", "app.seek(-1)", "-10 s"),
    Binding("right", "app.seek(1)", "+10 s"),
    Binding("plus,equals_sign", "app.speed(1)", "faster"),
    Binding("minus", "app.speed(-1)", "slower"),
)
"""The replay's keys, which still drive it with the modal open (the app's priority
bindings: stepping a replay while watching one request is what the modal follows it
for). Repeated here for the footer, which shows only the modal's own bindings; the
app's ``check_action`` hides them, and lets those keys through, where there is no
replay."""


class FieldsBox(VerticalScroll, inherit_bindings=False):
    """The modal's box: it scrolls up and down, not sideways (its fields fold to its
    width), so ← and → are the replay's alone and the footer lists them in their place
    (the box's own binding of a key comes first in the footer's order)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        b for b in VerticalScroll.BINDINGS if isinstance(b, Binding)
        and b.key not in ("left", "right", "ctrl+pageup", "ctrl+pagedown")]


def _text(x: object, empty: str = fmt.NA) -> Text:
    """A client's or an upstream's string as plain text (never markup), its control
    characters made visible."""
    s = as_str(x)
    return Text(printable(s) if s else empty)


def _start(t: float | None) -> str:
    if t is None:
        return fmt.NA
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return fmt.NA


def detail_rows(row: Mapping[str, Any], finished: bool) -> list[tuple[str, Text]]:
    """The modal's lines, label and value: every field of an active row worth reading."""
    upstream = as_str(row.get("upstream_id"))
    engine = Text(printable(upstream)) if upstream else Text(
        NONE if finished else NOT_NAMED, style="dim")
    ttft = as_num(row.get("ttft_s"))
    status = row.get("status")
    prompt = as_num(row.get("prompt_tokens"))
    tokens = as_num(row.get("completion_tokens"))
    if tokens is None:
        tokens = as_num(row.get("tokens"))
    stream = row.get("stream")
    state = as_str(row.get("state")) or "?"
    lines: list[tuple[str, Text]] = [
        ("llmtop id", _text(row.get("id"), "?")),
        ("engine id", engine),
    ]
    if as_str(row.get("proxy")) is not None:
        lines.append(("proxy", _text(row.get("proxy"))))
    lines += [
        ("user", _text(row.get("user"), "(empty)")),
        ("model", _text(row.get("model"))),
        ("path", _text(row.get("path"))),
        ("dialect", _text(row.get("dialect"))),
        ("stream", Text(fmt.NA if not isinstance(stream, bool) else
                        "yes" if stream else "no")),
        ("state", Text(FINISHED if finished else printable(state))),
        ("status", Text(str(status) if isinstance(status, int)
                        and not isinstance(status, bool) else "not sent yet")),
        ("age", Text(fmt.latency(as_num(row.get("age_s"))))),
        ("TTFT", Text(fmt.latency(ttft) if ttft is not None else
                      "no token" if finished else "waiting")),
        ("prompt tokens", Text(fmt.count(prompt) if prompt is not None else "not known yet")),
        ("tokens so far", Text(fmt.count(tokens))),
        ("tok/s", Text(fmt.rate(as_num(row.get("tps"))))),
        ("concurrency at start", Text(fmt.count(as_num(row.get("concurrency_at_start"))))),
        ("started", Text(_start(as_num(row.get("t_start"))))),
    ]
    return lines


class RequestDetail(ModalScreen[None]):
    """One active request's fields; escape or q closes it.

    It has its own footer, as the help has: a modal screen takes every key, so the main
    screen's keys do nothing while it is open — but a replay's (space, ←/→, +/-) still
    play the recording, the modal following the request through them, and its footer
    says so (:data:`REPLAY_BINDINGS`)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "close", key_display="esc/q"),
        *REPLAY_BINDINGS,
    ]

    DEFAULT_CSS = """
    RequestDetail { align: center middle; }
    RequestDetail > VerticalScroll {
        width: 90%; max-width: 90; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, row: Mapping[str, Any], palette: Palette | None = None,
                 stale: StaleRows | None = None) -> None:
        super().__init__()
        self.key = request_key(row)
        self.row: Mapping[str, Any] = row
        """The request's last row seen (kept when it ends)."""
        self.finished = False
        self.not_refreshed = (stale or StaleRows()).why(self.key[0])
        """Why the last list did not refresh the request (its figures are the last
        ones had); ``None`` when it did."""
        self.palette = palette or Palette()
        self.body = Static(id="request-fields")

    def compose(self) -> ComposeResult:
        with FieldsBox() as box:
            box.border_title = "request"
            yield self.body
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self._render_fields()

    def follow(self, active: Sequence[Mapping[str, Any]], palette: Palette,
               stale: StaleRows | None = None) -> None:
        """The request's row in the latest active list, or "finished" (and the last
        figures) when it is no longer there. ``stale`` says which rows the list could
        not refresh: when the request's are among them, its row (kept) is not news, and
        its absence not an end."""
        self.palette = palette
        self.not_refreshed = (stale or StaleRows()).why(self.key[0])
        row = next((r for r in dicts(active) if request_key(r) == self.key), None)
        if row is not None:  # a replay seeked back to before its end shows it open again
            self.row, self.finished = row, False
        elif self.not_refreshed is None:
            self.finished = True
        if self.is_mounted:
            self._render_fields()

    def _render_fields(self) -> None:
        table = Table.grid(padding=(0, 2))
        table.add_column(style=self.palette.dim, no_wrap=True)
        table.add_column(overflow="fold")  # the whole engine id, to copy: never cut
        for label, value in detail_rows(self.row, self.finished):
            table.add_row(Text(label), value)
        self.body.update(table)
        box = self.query_one(VerticalScroll)
        box.border_title = Text(f"request {printable(as_str(self.row.get('id')) or '?')}")
        if self.finished:
            box.border_subtitle = Text(f"{FINISHED} · its last figures",
                                       style=self.palette.warn)
        elif self.not_refreshed is not None:
            box.border_subtitle = Text(
                f"{NOT_REFRESHED} ({printable(self.not_refreshed)}) · its last figures",
                style=self.palette.warn)
        else:
            box.border_subtitle = ""

    def action_close(self) -> None:
        self.dismiss(None)
