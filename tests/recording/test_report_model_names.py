"""The report's models counted a request with no model and one for a model really named
"unknown" as one "unknown", and a blank name ("  ") apart; the live rows and /metrics
(labels.model_label, eab0e7a) tell the first two apart and fold the blank into "unknown".
The report now names them as the live rows do."""

from __future__ import annotations

import time
from pathlib import Path

from rec_helpers import request, write_recording

from llmtop.recording.report.analyse import analyse


def test_models_are_named_as_the_live_rows_name_them(tmp_path: Path) -> None:
    now = time.time()
    events = [request(k, now - 10 + k, model=m)  # type: ignore[arg-type]
              for k, m in enumerate([None, "", "  ", "unknown", "unknown", "m"])]
    path = tmp_path / "m.jsonl"
    write_recording(path, list(events))
    assert analyse(path)["conditions"]["models"] == {"unknown": 3, "unknown_": 2, "m": 1}
