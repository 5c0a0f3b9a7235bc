"""The report as JSON (the analysis dict as it is: conditions, figures, series)."""

from __future__ import annotations

import json
from typing import Any, Final

from llmtop.textsafe import BIDI_CONTROLS

_ESCAPE: Final[dict[int, str]] = {
    c: f"\\u{c:04x}"
    for c in (0x7F, *range(0x80, 0xA0), *BIDI_CONTROLS, *range(0xD800, 0xE000))
}
"""What ``json.dumps(ensure_ascii=False)`` leaves raw but a terminal or encoder must not
meet: DEL and C1 controls (U+009B is a CSI on some terminals), bidi overrides, and lone
surrogates (no encoding writes them). A JSON escape such as ``\\u009b`` keeps each value
exactly."""


def render_json(report: dict[str, Any]) -> str:
    """Indented JSON, NaN-free (the analysis already maps non-finite numbers to null);
    non-ASCII text kept readable, but every control character escaped (C0 by ``json``
    itself, DEL, C1, bidi and lone surrogates here): safe to print to a terminal."""
    text = json.dumps(report, indent=2, allow_nan=False, ensure_ascii=False)
    return text.translate(_ESCAPE) + "\n"
