"""The report as JSON (the analysis dict as it is: conditions, figures, series)."""

from __future__ import annotations

import json
from typing import Any


def render_json(report: dict[str, Any]) -> str:
    """Indented JSON, NaN-free (the analysis already maps non-finite numbers to null)."""
    return json.dumps(report, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
