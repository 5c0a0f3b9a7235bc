"""llmtop replay takes an uncompressed recording's length from its last lines, before it has
read the file: a damaged time there (one the reader skips) must not become the length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.recording.replay import ReplaySource

YEAR = 365 * 86400.0


def _recording(path: Path) -> tuple[list[dict[str, object]], float]:
    write_recording(path, session(40, duration_s=20))
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    ReplaySource(path).engine.close()
    src = ReplaySource(path)
    true = src.duration_s
    src.engine.close()
    assert true is not None and 15 < true < 45, true
    return objs, true


def _write(path: Path, objs: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


@pytest.mark.parametrize("footer", [True, False])
def test_a_last_line_a_year_late_is_not_the_length(tmp_path: Path, footer: bool) -> None:
    """The last event line's time a year late (a damaged digit): the reader skips it
    ('its time is more than a day after the events around it'), but the replay's length,
    read from the tail before the file, was a year: the TUI showed 8760 h to play, and a
    seek to the end went past every event."""
    path = tmp_path / "r.jsonl"
    objs, true = _recording(path)
    last = max(i for i, o in enumerate(objs) if o["type"] in ("gpu", "engine", "request"))
    o = objs[last]
    if o["type"] == "request":
        o["t_start"] = float(o["t_start"]) + YEAR  # type: ignore[arg-type]
    else:
        o["t"] = float(o["t"]) + YEAR  # type: ignore[arg-type]
    if not footer:
        objs = [x for x in objs if x["type"] != "footer"]
    _write(path, objs)
    src = ReplaySource(path)
    try:
        d = src.duration_s
        assert d is not None and d < true + 1, d  # the events before it: about `true`
    finally:
        src.engine.close()


def test_a_long_idle_gap_at_the_end_confirmed_by_the_footer_is_kept(tmp_path: Path) -> None:
    """The other side: the last events two days after the rest, with the footer beside
    them, is a real gap (the reader reads them), so the length includes it."""
    path = tmp_path / "r.jsonl"
    objs, true = _recording(path)
    body = [o for o in objs if o["type"] not in ("header", "footer")]
    for o in body[-3:]:
        if o["type"] == "request":
            o["t_start"] = float(o["t_start"]) + 2 * 86400  # type: ignore[arg-type]
        else:
            o["t"] = float(o["t"]) + 2 * 86400  # type: ignore[arg-type]
    foot = objs[-1]
    assert foot["type"] == "footer"
    foot["ended_at"] = float(foot["ended_at"]) + 2 * 86400  # type: ignore[arg-type]
    _write(path, objs)
    src = ReplaySource(path)
    try:
        d = src.duration_s
        assert d is not None and 2 * 86400 < d < 2 * 86400 + true + 1, d
    finally:
        src.engine.close()
