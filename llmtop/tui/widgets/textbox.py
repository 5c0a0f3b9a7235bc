"""The text boxes (the filter, the recording path): what is pasted into them loses its
control characters.

Typed keys are printable, but a paste is taken as it comes: ``ESC ] 0 ; …`` in the
clipboard went into the box, and from it to the screen as it was (the users panel's
"filter: …", the box itself) and in a recording path to the proxy."""

from __future__ import annotations

from typing import Final

from textual import events
from textual.widgets import Input

from llmtop.textsafe import BIDI_CONTROLS

DROPPED: Final[dict[int, None]] = dict.fromkeys(
    [*range(0x20), 0x7F, *range(0x80, 0xA0), *BIDI_CONTROLS, *range(0xD800, 0xE000)])
"""C0 and C1 controls (a tab, too), DEL, bidi overrides and lone surrogates."""


def typeable(text: str) -> str:
    """``text`` without the characters no key types (:data:`DROPPED`)."""
    return text if text.isprintable() else text.translate(DROPPED)


class TextBox(Input):
    """An :class:`Input` whose pastes keep only what could have been typed (the first
    line, as Input keeps, then :func:`typeable`)."""

    def _on_paste(self, event: events.Paste) -> None:
        # runs before Input's own _on_paste (Textual calls each class's handler in turn)
        lines = event.text.splitlines()
        event.text = typeable(lines[0]) if lines else ""
