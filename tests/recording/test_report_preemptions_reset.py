"""The report's engine section counts the preemptions of the whole recording across an
engine restart (``preemptions``: the counter's rises); ``preemptions_last`` −
``preemptions_first``, the only figure before, went negative when the engine restarted."""

from __future__ import annotations

from pathlib import Path

from rec_helpers import T0, request, write_recording

from llmtop.events import EngineReading, Event
from llmtop.recording.report.analyse import analyse


def test_preemptions_are_counted_across_an_engine_restart(tmp_path: Path) -> None:
    counts = [100, 110, 130, 0, 5, 12]  # 30, a restart, then 12: 42
    events: list[Event] = [request(i, T0 + i) for i in range(6)]
    events += [EngineReading(t=T0 + i + 0.5, kind="vllm", running=1, waiting=0,
                             preemptions=c) for i, c in enumerate(counts)]
    events.sort(key=lambda e: e.t if isinstance(e, EngineReading) else e.t_start)  # type: ignore[union-attr]
    path = tmp_path / "r.jsonl"
    write_recording(path, events)
    engine = analyse(path)["engine"]
    assert engine["preemptions_first"] == 100 and engine["preemptions_last"] == 12
    assert engine["preemptions"] == 42
