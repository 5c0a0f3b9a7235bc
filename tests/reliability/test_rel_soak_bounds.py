"""What a proxy left running for weeks keeps per unit of traffic stays bounded: structures
filled by many distinct requests, parts or names stop at their bound (found by the memory
soak, ``benchmarks/soak_memory.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from llmtop.clock import unix_now
from llmtop.events import RequestRecord
from llmtop.recording.writer import Recorder


def _record(i: int, t: float) -> RequestRecord:
    offs = tuple(0.2 + k * 0.02 for k in range(10))
    return RequestRecord(
        id=f"r{i}", user=f"u-{i}", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=t, ttft_s=0.2, e2e_s=offs[-1] + 0.001,
        prompt_tokens=100, completion_tokens=10, token_source="usage",
        chunk_offsets_s=offs, chunk_tokens=(1,) * 10, concurrency_at_start=1, error=None)


def _feed(rec: Recorder, n: int) -> None:
    for i in range(0, n, 10):
        rec.on_events([_record(k, unix_now() - 1.0) for k in range(i, i + 10)])
        deadline = time.monotonic() + 30
        while rec.status()["queued"] and time.monotonic() < deadline:
            time.sleep(0.01)


def test_rotation_without_keep_remembers_no_part(tmp_path: Path) -> None:
    """Rotating with no ``keep`` deletes nothing, so the recorder has no part to remember:
    every closed part's path was kept in a list that only ``keep`` ever read (a proxy
    rotating every few MB for weeks held one entry per part, for good)."""
    rec = Recorder(tmp_path / "p.jsonl", header={}, flush_s=0.1, order_hold_s=0.0,
                   rotate_bytes=3000)
    rec.start()
    try:
        _feed(rec, 200)
        assert rec.status()["part"] >= 10
        assert len(rec._parts) == 0
    finally:
        rec.stop()
    assert len(list(tmp_path.iterdir())) >= 10  # and every part is still on disk
