"""`llmtop report` after QA: exact requests in flight, no false model warning from failed
requests, judged counts in the capacity table, capacity wording when nothing holds, and
non-streamed requests kept out of TTFT. Every recording is written by the real recorder
and read back by ``llmtop report`` (``llmtop.cli.main``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord

SLO = {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}


def report_json(capsys: pytest.CaptureFixture[str], *files: Path,
                extra: tuple[str, ...] = ()) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", *map(str, files), "--format", "json", "-q", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def report_text(capsys: pytest.CaptureFixture[str], *files: Path,
                fmt: str = "text") -> str:
    capsys.readouterr()
    assert main(["report", *map(str, files), "--format", fmt, "-q"]) == 0
    return capsys.readouterr().out


def by_end(recs: list[RequestRecord]) -> list[Event]:
    """Records in the order a recorder writes them: when each finished."""
    return sorted(recs, key=lambda r: r.t_start + r.e2e_s)


def exact_overlap(recs: list[RequestRecord]) -> int:
    """The most records open at one instant, by brute force over every start."""
    return max(sum(1 for o in recs if o.t_start <= r.t_start < o.t_start + o.e2e_s)
               for r in recs)


# -- 2. requests in flight, exactly ---------------------------------------------------------

def test_in_flight_is_exact_between_ticks(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Bursts of 11 overlapping requests that all start and end between two ticks of the
    replay (every 1 s): a tick-sampled figure reads 0 in flight; the records say 11, and
    the mean is Σ E2E ÷ span."""
    t0 = soon()
    recs = []
    i = 0
    for burst in range(6):
        base = t0 + 2.0 * burst + 0.2
        for k in range(11):
            r = request(i, base + 0.005 * k, ttft=0.05, gap=0.01, n_chunks=5)
            recs.append(r)
            i += 1
    path = tmp_path / "bursts.jsonl"
    write_recording(path, by_end(recs), header={"upstream": "u", "slo": SLO})
    r = report_json(capsys, path)
    infl = r["conditions"]["in_flight"]
    assert exact_overlap(recs) == 11
    assert infl["max"] == 11
    span = r["throughput"]["span_s"]
    assert infl["mean"] == pytest.approx(sum(x.e2e_s for x in recs) / span, rel=1e-5)
    # the time series says the same over its windows (10 s windows here: every burst
    # shows in some point, and no point exceeds the overlap)
    series = r["series"]
    begin = r["conditions"]["started_at"]
    assert series and max(p["in_flight_max"] for p in series) == 11
    for p in series:
        end = begin + p["t"]
        start = max(begin, end - p["window_s"])
        busy = sum(max(0.0, min(x.t_start + x.e2e_s, end) - max(x.t_start, start))
                   for x in recs)
        assert p["in_flight_mean"] == pytest.approx(busy / (end - start), abs=1e-5)
        first = [max(0.0, min(x.t_start + (x.ttft_s or 0.0), end) - max(x.t_start, start))
                 for x in recs]
        assert p["waiting_mean"] == pytest.approx(sum(first) / (end - start), abs=1e-5)
    text = report_text(capsys, path)
    assert f"in flight mean {infl['mean']:.1f}, max 11" in text


def test_in_flight_counts_a_request_longer_than_the_replay_read_ahead(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 900 s request (past the replay's 600 s read-ahead) overlapping short ones: the
    mean counts all of its 900 s."""
    t0 = soon()
    long = request(0, t0, ttft=0.1, gap=100.0, n_chunks=10)  # ≈ 900 s
    short = [request(i, t0 + 10.0 * i, ttft=0.1, gap=0.1, n_chunks=10) for i in range(1, 80)]
    recs = [long, *short]
    path = tmp_path / "long.jsonl"
    write_recording(path, by_end(recs), header={"upstream": "u", "slo": SLO})
    r = report_json(capsys, path)
    infl = r["conditions"]["in_flight"]
    span = max(x.t_start + x.e2e_s for x in recs) - r["conditions"]["started_at"]
    assert r["throughput"]["span_s"] == pytest.approx(span)
    assert infl["max"] == 2
    assert infl["mean"] == pytest.approx(sum(x.e2e_s for x in recs) / span, rel=1e-6)


def test_step_count_edges() -> None:
    """Touching requests do not overlap; a zero-length one is never in flight; no records
    reads 0, and a mean over an empty span is None."""
    from llmtop.recording.report.inflight import StepCount

    sc = StepCount([0.0, 1.0, 2.0, 2.0], [1.0, 2.0, 2.0, 3.0])
    assert sc.max() == 1
    assert sc.mean(0.0, 3.0) == pytest.approx(1.0)
    assert sc.mean(0.5, 0.5) is None
    assert StepCount([], []).max() == 0 and StepCount([], []).mean(0.0, 1.0) == 0.0
    nested = StepCount([0.0, 0.1, 0.2], [10.0, 0.3, 0.25])
    assert nested.max() == 3
    assert nested.maxima([0.26, 0.0, 5.0], [9.0, 0.15, 6.0]).tolist() == [2, 2, 1]


# -- 3. the comparison's model warning looks at what served the requests -------------------

def _workload(path: Path, *, served: str, failed_as: str | None, n: int = 120) -> None:
    """n requests at one arrival rate; every tenth failed, recorded under ``failed_as``
    (the name the client asked for) when given."""
    t0 = soon()
    recs = []
    for i in range(n):
        failed = failed_as is not None and i % 10 == 9
        recs.append(request(i, t0 + 0.5 * i, model=failed_as if failed else served,
                            outcome="error" if failed else "ok", ttft=0.1, gap=0.01,
                            concurrency=1 + i % 4))
    write_recording(path, by_end(recs), header={"upstream": "u", "slo": SLO})


def test_failed_requests_model_names_do_not_make_a_model_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _workload(a, served="smollm2-135m-instruct", failed_as="m")
    _workload(b, served="smollm2-135m-instruct", failed_as=None)
    text = report_text(capsys, a, b)
    assert "different models" not in text
    cmp = report_json(capsys, a, b)
    assert not any("models" in w for w in cmp["warnings"]), cmp["warnings"]
    assert cmp["reports"][0]["conditions"]["models_ok"] == {"smollm2-135m-instruct": 108}
    assert cmp["reports"][0]["conditions"]["models"] == {"smollm2-135m-instruct": 108, "m": 12}
    # a real difference in what served the requests still warns
    c = tmp_path / "c.jsonl"
    _workload(c, served="llama-3-8b", failed_as="m")
    text = report_text(capsys, a, c)
    assert "different models: A smollm2-135m-instruct; B llama-3-8b" in text


# -- 4 and 5. the capacity table's judged counts; "none" when even concurrency 1 fails -------

def _failing_at_one(path: Path) -> None:
    """21 requests one at a time: one cancelled while on track (not judged), 10 meet the
    SLOs, 10 start too slowly (TTFT 0.7 s > 0.5 s): 50% of 20 judged."""
    t0 = soon()
    recs = [request(0, t0, outcome="cancelled", ttft=0.2)]
    recs += [request(i, t0 + i, ttft=0.1 if i % 2 else 0.7, gap=0.01) for i in range(1, 21)]
    write_recording(path, by_end(recs), header={"upstream": "u", "slo": SLO})


def test_capacity_table_says_how_many_requests_were_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.jsonl"
    _failing_at_one(path)
    r = report_json(capsys, path)
    (row,) = r["by_concurrency"]
    assert row["requests"] == 21 and row["judged"] == 20
    assert row["slo_attainment"] == pytest.approx(10 / 20)
    text = report_text(capsys, path)
    section = text.split("CAPACITY AT SLO", 1)[1].split("\n\n", 1)[0].splitlines()
    line = next(ln for ln in section if ln.split()[:1] == ["1"])
    assert "21 (20 judged)" in line and "50.0%" in line, line
    page = report_text(capsys, path, fmt="html")
    assert "<td>21 (20 judged)</td>" in page


def test_capacity_when_even_concurrency_1_misses_the_slos(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.jsonl"
    _failing_at_one(path)
    r = report_json(capsys, path)
    cap = r["capacity"]  # the JSON fields keep their meaning: 0 = no level holds
    assert cap["max_concurrency_at_slo"] == 0 and cap["first_failing_concurrency"] == 1
    assert cap["goodput_tps_at_slo"] == 0.0
    text = report_text(capsys, path)
    want = ("none — even concurrency 1, the lowest level seen, misses the SLOs (met by 50.0% "
            "of its 20 judged requests; target 95.0%)")
    assert f"  {want}\n" in text
    assert "≈ 0" not in text and "first failing level" not in text
    page = report_text(capsys, path, fmt="html")
    assert "None</b> — even concurrency 1, the lowest level seen, misses the SLOs" in page
    assert "≈ <b>0</b>" not in page
    # the comparison's figure row reads "none", not 0
    cmp_text = report_text(capsys, path, path)
    row = next(ln for ln in cmp_text.splitlines() if "max concurrency at SLO" in ln)
    assert row.split()[4:6] == ["none", "none"], row


# -- 1. non-streamed requests in a report ---------------------------------------------------

def test_report_leaves_non_streamed_requests_out_of_ttft(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A llama.cpp-like session: streamed requests start in ~30 ms, non-streamed ones take
    ~1.04 s to answer whole. TTFT percentiles are the streamed ones'; the non-streamed are
    judged on no error (no E2E objective here) and meet the SLOs."""
    import dataclasses

    t0 = soon()
    recs = []
    for i in range(40):
        if i % 2:
            r = request(i, t0 + i, ttft=1.04, n_chunks=1, tokens_per_chunk=30)
            recs.append(dataclasses.replace(r, stream=False, e2e_s=1.041))
        else:
            recs.append(request(i, t0 + i, ttft=0.03, gap=0.01))
    path = tmp_path / "mixed.jsonl"
    write_recording(path, by_end(recs), header={"upstream": "u", "slo": SLO})
    r = report_json(capsys, path)
    assert r["conditions"]["streaming_share"] == pytest.approx(0.5)
    ttft = r["latency"]["ttft"]
    assert ttft["count"] == 20 and ttft["p50"] == pytest.approx(0.03, rel=1e-2)
    assert ttft["max"] == pytest.approx(0.03, rel=1e-2)
    assert r["latency"]["e2e"]["count"] == 40
    assert r["latency"]["tpot"]["count"] == 20
    assert r["slo"]["attainment"] == pytest.approx(1.0)
    (row,) = r["by_concurrency"]
    assert row["ttft_p95"] == pytest.approx(0.03, rel=1e-2) and row["slo_attainment"] == 1.0
    assert r["users"][0]["ttft_p95"] == pytest.approx(0.03, rel=1e-2)


def test_a_bad_second_file_is_told_before_the_first_is_analysed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `llmtop report big.jsonl typo.jsonl` used to analyse big.jsonl in full (21 s for a
    # 147 MB recording) and only then say "typo.jsonl: no such file".
    import llmtop.recording.report.analyse as analyse_mod

    good = tmp_path / "good.jsonl"
    write_recording(good, [request(i, 1_000.0 + i) for i in range(3)],
                    header={"upstream": "u", "slo": SLO})
    (tmp_path / "garbage.jsonl").write_text("garbage\n")
    analysed: list[str] = []
    real = analyse_mod.analyse

    def spy(path: Any, **kw: Any) -> Any:
        analysed.append(str(path))
        return real(path, **kw)

    monkeypatch.setattr(analyse_mod, "analyse", spy)
    for second, says in (("missing.jsonl", "no such file"),
                         ("garbage.jsonl", "not an llmtop recording")):
        capsys.readouterr()
        assert main(["report", str(good), str(tmp_path / second), "-q"]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
        assert analysed == []
    assert main(["report", str(good), str(good), "-q"]) == 0
    assert analysed == [str(good), str(good)]
