"""Client-chosen strings made safe to print on a terminal.

User ids, model names, paths and error texts come from whoever sends requests through the
proxy. Written to a terminal as they are, ``ESC ] 52 ; c ; …`` sets the operator's
clipboard, ``ESC ] 0 ; …`` the window title, ``ESC [ 2 J`` clears the screen, and a
right-to-left override makes text read backwards. :func:`printable` is applied wherever
such a string reaches a terminal (the TUI's tables and titles, ``llmtop report`` text).
"""

from __future__ import annotations

from typing import Final

BIDI_CONTROLS: Final = frozenset(
    [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
"""LRE, RLE, PDF, LRO, RLO and LRI, RLI, FSI, PDI: dropped (they reorder what follows)."""

_TABLE: Final[dict[int, str | None]] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    **dict.fromkeys(BIDI_CONTROLS),
    **dict.fromkeys(range(0xD800, 0xE000), "\ufffd"),
}
"""C0 controls (tab and newline too: one line stays one line), DEL and C1 controls as a
visible ``\\x1b``; bidi controls removed; lone surrogates (JSON allows ``"\\ud800"``; no
terminal encoding does) as U+FFFD."""


def printable(s: str) -> str:
    """``s`` with every control character shown as a visible ``\\xNN`` escape (ESC, BEL,
    NUL, CR, newline, tab, DEL, C1), bidi overrides and isolates removed and lone
    surrogates replaced by U+FFFD. Anything else (CJK, emoji, combining marks) is kept.
    Idempotent: the escapes it writes are printable."""
    if s.isprintable():  # the common case: no control, format or surrogate character
        return s
    return s.translate(_TABLE)
