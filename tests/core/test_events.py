"""Derived figures follow shared/docs/domain.md; records round-trip through JSON."""

from __future__ import annotations

import json

import pytest

from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent


def rec(**kw: object) -> RequestRecord:
    base: dict[str, object] = {
        "id": "r1", "user": "alice", "model": "m", "dialect": "openai",
        "path": "/v1/chat/completions", "stream": True, "status": 200, "outcome": "ok",
        "t_start": 1000.0, "ttft_s": 0.2, "e2e_s": 1.2,
        "prompt_tokens": 10, "completion_tokens": 6, "token_source": "usage",
        "chunk_offsets_s": (0.2, 0.4, 0.8, 1.2), "chunk_tokens": (1, 1, 2, 2),
    }
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_itl_spreads_a_multi_token_chunk_over_its_tokens() -> None:
    r = rec()
    assert r.chunk_gaps_s() == pytest.approx([0.2, 0.4, 0.4])
    # gap 0.4 with 2 tokens → two samples of 0.2
    assert r.itl_samples_s() == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.2])


def test_mean_itl_equals_tpot() -> None:
    r = rec()
    itl = r.itl_samples_s()
    tpot = r.tpot_s()
    assert tpot is not None
    assert sum(itl) / len(itl) == pytest.approx(tpot)


def test_tpot_and_tps_need_more_than_one_token() -> None:
    assert rec(completion_tokens=1).tpot_s() is None
    assert rec(ttft_s=None).tps() is None
    assert rec().tps() == pytest.approx(5 / 1.0)


def test_a_non_streamed_answer_has_no_tpot_or_tps() -> None:
    """QA: a non-streaming answer arrives whole (TTFT == E2E): TPOT read 0 s — into the
    TPOT percentiles, meeting any TPOT SLO — and the export paired it with tps None."""
    whole = rec(stream=False, ttft_s=0.8, e2e_s=0.8, chunk_offsets_s=(0.8,),
                chunk_tokens=(30,), completion_tokens=30)
    assert whole.tpot_s() is None and whole.tps() is None
    assert rec(stream=True, ttft_s=0.8, e2e_s=0.8, chunk_offsets_s=(0.8,),
               chunk_tokens=(30,), completion_tokens=30).tpot_s() == 0.0  # streamed: seen


def test_request_record_round_trip() -> None:
    r = rec()
    d = json.loads(json.dumps(r.to_json_dict()))
    assert d["type"] == "request"
    assert RequestRecord.from_json_dict(d) == r


def test_other_events_round_trip() -> None:
    g = GpuReading(t=1.0, index=0, name="H200", mem_used_bytes=1, mem_total_bytes=2,
                   dram_bw_util=55.0, simulated=True)
    assert GpuReading.from_json_dict(json.loads(json.dumps(g.to_json_dict()))) == g
    e = EngineReading(t=1.0, kind="vllm", running=3, waiting=1, kv_cache_usage=0.5,
                      ttft_buckets=((0.1, 2.0), (float("inf"), 3.0)), raw={"a": 1.0})
    text = json.dumps(e.to_json_dict(), allow_nan=False)  # strict JSON: +Inf as a string
    back = EngineReading.from_json_dict(json.loads(text))
    assert back == e
    w = WarningEvent(t=1.0, code="QUEUEING", severity="warning", message="x", state="cleared")
    assert WarningEvent.from_json_dict(w.to_json_dict()) == w


def test_a_request_lost_with_its_process_is_an_error_with_what_was_known() -> None:
    from llmtop.events import ActiveRequest

    a = ActiveRequest("r1", "alice", "m", "openai", "/v1/chat/completions", True,
                      t_start=100.0, t0_ns=1_000_000_000, concurrency_at_start=3,
                      first_token_ns=1_250_000_000, last_chunk_ns=1_900_000_000,
                      chunks=7, tokens=9)
    rec = a.lost(3_000_000_000, "llmtop worker 0 exited (killed by SIGKILL)")
    assert (rec.outcome, rec.status, rec.t_start) == ("error", 200, 100.0)
    assert rec.ttft_s == 0.25 and rec.e2e_s == 2.0 and rec.completion_tokens == 9
    assert rec.concurrency_at_start == 3 and rec.error is not None
    waiting = ActiveRequest("r2", "bob", None, "openai", "/v1", True, 0.0, 0)
    assert waiting.lost(10, "x").status == 502 and waiting.lost(10, "x").ttft_s is None
    assert RequestRecord.from_json_dict(rec.to_json_dict()) == rec
    assert rec.prompt_tokens is None  # the last report did not know it


def test_a_request_lost_after_its_head_keeps_its_status_and_prompt_size() -> None:
    """The worker's last report had the head sent (200) and the prompt's size: the record
    says what the client got (a 200 cut short, not a 502) and how long the prompt was."""
    from llmtop.events import ActiveRequest

    a = ActiveRequest("r3", "carol", "m", "anthropic", "/v1/messages", True, 0.0, 0,
                      status=200, prompt_tokens=12)
    rec = a.lost(10, "llmtop worker 1 exited (exit code 3)")
    assert (rec.status, rec.prompt_tokens, rec.ttft_s, rec.outcome) == (200, 12, None, "error")
    row = a.to_json_dict(10)
    assert (row["status"], row["prompt_tokens"], row["state"]) == (200, 12, "waiting")
