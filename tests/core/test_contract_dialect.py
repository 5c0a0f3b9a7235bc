"""The ``dialect`` values the recording and the admin API carry are the ones the outside
contract (interfaces.md) lists: ``openai``, ``anthropic``, ``ollama``, ``tgi``, ``other``.

The proxy tells SGLang's native ``/generate`` apart (dialect ``sglang``, its own parsers),
and wrote that name into the recording's ``request`` lines and the admin API's request
lists — a value tools validating the page's list refuse. It is written ``other`` now; the
record keeps ``sglang`` inside the process. (The live check, through a real proxy and
``llmtop sim``, is tests/core/test_contract_live.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmtop.events import DIALECTS, OUTSIDE_DIALECTS, ActiveRequest, RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder, event_dict


def _record(dialect: str) -> RequestRecord:
    return RequestRecord(
        id="r1", user="u", model="m", dialect=dialect, path="/generate",  # type: ignore[arg-type]
        stream=True, status=200, outcome="ok", t_start=time.time(), ttft_s=0.01, e2e_s=0.05,
        prompt_tokens=3, completion_tokens=4, token_source="usage",
        chunk_offsets_s=(0.01, 0.05), chunk_tokens=(1, 3), concurrency_at_start=1)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_is_written_as_one_the_page_lists(dialect: str) -> None:
    want = "other" if dialect == "sglang" else dialect
    rec = _record(dialect)
    assert event_dict(rec)["dialect"] == want  # the recording's line
    assert rec.to_json_dict()["dialect"] == want  # /llmtop/v1/requests?state=recent
    active = ActiveRequest("a1", "u", "m", dialect, "/generate",  # type: ignore[arg-type]
                           True, time.time(), time.perf_counter_ns())
    assert active.to_json_dict(time.perf_counter_ns())["dialect"] == want  # state=active
    assert rec.dialect == dialect  # inside the process, unchanged
    assert want in OUTSIDE_DIALECTS


def test_an_sglang_request_reads_back_from_a_recording_as_other(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec = Recorder(path, header={"upstream": "http://127.0.0.1:9", "slo": {}})
    rec.start()
    rec.on_events([_record("sglang")])
    rec.stop()
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [ln["dialect"] for ln in lines if ln["type"] == "request"] == ["other"]
    with RecordingReader(path) as reader:
        (back,) = [e for e in reader if isinstance(e, RequestRecord)]
    assert back.dialect == "other" and back.path == "/generate"
