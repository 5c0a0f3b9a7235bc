"""Requests longer than the replay's read-ahead (600 s): a 15-minute answer was read only 600
s before its end, so its tokens so far landed in one tick — a report of answers streaming at
most 400 tok/s printed a 1,537 tok/s peak and 0 tok/s while three streamed. The read-ahead
now grows to the longest request read, the report replays once more when any started late,
and a seek backwards keeps the grown read-ahead."""

from __future__ import annotations

from pathlib import Path

from rec_helpers import request, soon, write_recording

from llmtop.events import Event
from llmtop.recording.replay import DEFAULT_LOOKAHEAD_S, ReplayEngine
from llmtop.recording.report.analyse import analyse

RATE = 10.0  # tokens a second, every request
LONG_S = 900.0


def _long_session(path: Path) -> None:
    """Six 900 s answers at 10 tok/s, started 200 s apart from t=5 s, so up to five
    overlap, and a one-token answer every 20 s (the first read, at 0.5 s): the system rate
    is about 10 × (long requests open), never much more than 50 tok/s."""
    start = soon()
    recs = [request(i, start + 5.0 + 200.0 * i, ttft=0.5, gap=1 / RATE,
                    n_chunks=int((LONG_S - 1) * RATE)) for i in range(6)]
    recs += [request(100 + i, start + 20.0 * i, ttft=0.4, n_chunks=1) for i in range(100)]
    events: list[Event] = sorted(recs, key=lambda r: r.t_start + r.e2e_s)
    write_recording(path, events)


def test_the_engine_grows_its_read_ahead_to_the_longest_request(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    _long_session(path)
    eng = ReplayEngine(path, tick_s=1.0)
    eng.run_to_end()
    assert eng.max_e2e_s > LONG_S - 2
    assert eng.lookahead_s > eng.max_e2e_s > DEFAULT_LOOKAHEAD_S
    # late: the long requests that had started when the first one was read (at 305 s,
    # started 5 s and 205 s); the read-ahead then covers the rest
    assert eng.late_starts == 2
    eng.close()
    again = ReplayEngine(path, tick_s=1.0, lookahead_s=eng.lookahead_s)
    again.run_to_end()
    assert again.late_starts == 0
    again.close()


def test_the_report_times_long_answers_right(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    _long_session(path)
    r = analyse(path)
    tps = [p["output_tps"] for p in r["series"] if p["output_tps"] is not None]
    # at most five streams of 10 tok/s are ever open: no burst of a request's past tokens
    # (started 300 s late, the first one put 3,000 tokens in one tick: 300 tok/s in 10 s)
    assert max(tps) <= 5 * RATE * 1.2, max(tps)
    assert r["throughput"]["output_tps_peak"] <= 5 * RATE * 1.2
    # while a request streams, the system rate is never 0
    busy = [p for p in r["series"] if p["in_flight_max"] and p["t"] > 30]
    assert busy and all((p["output_tps"] or 0) > 0 for p in busy)


def test_token_count_statistics_are_exact_where_they_can_be(tmp_path: Path) -> None:
    """64 answers of exactly 16,385 tokens read "p50 16,399 · min 16,384, max 16,399, mean
    16,392" (an HDR histogram's 3 significant digits); min, mean and max are now exact and
    percentiles stay within them."""
    path = tmp_path / "same.jsonl"
    start = soon()
    recs = [request(i, start + i, n_chunks=5, tokens_per_chunk=3277) for i in range(64)]
    recs.append(request(64, start + 70, n_chunks=5, tokens_per_chunk=3278))  # 16,390
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s))
    d = analyse(path)["conditions"]["completion_tokens"]
    assert (d["count"], d["min"], d["max"]) == (65, 16_385, 16_390)
    assert d["mean"] == (64 * 16_385 + 16_390) / 65
    assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
