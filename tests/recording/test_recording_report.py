"""`llmtop report`: conditions and figures from the live aggregation code, text / JSON /
HTML output, escaping, the two-recording comparison and its warnings, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.events import Event, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.replay import config_for
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.compare import comparison, condition_warnings
from llmtop.recording.report.html import render_html
from llmtop.recording.report.plots import PLOTS
from llmtop.recording.report.text import render_text

SLO = {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.95}


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event], dict[str, Any]]:
    path = tmp_path_factory.mktemp("rep") / "a.jsonl.gz"
    events = session(400, duration_s=120, gpus=2,
                     users=("alice", "bob", "<script>alert(1)</script>", "$x$ & co"))
    write_recording(path, events, header={"upstream": "http://gpu-box:8000/v1", "slo": SLO,
                                          "note": "<b>bold</b>"})
    return path, events, analyse(path)


def test_figures_come_from_the_aggregator(rec: tuple[Path, list[Event], dict[str, Any]]) -> None:
    _, events, r = rec
    agg = Aggregator(config_for({"slo": SLO}))
    agg.on_events(events)
    live = agg.snapshot(None)
    for m in ("ttft", "itl", "chunk_gap", "tpot", "e2e"):
        assert r["latency"][m] == live["latency"][m], m
    assert r["slo"]["attainment"] == live["system"]["slo_attainment"]
    assert r["capacity"]["max_concurrency_at_slo"] == live["capacity"]["max_concurrency_at_slo"]
    recs = [e for e in events if isinstance(e, RequestRecord)]
    o = r["outcomes"]
    assert o["requests"] == len(recs)
    assert o["errors"] == sum(e.outcome == "error" for e in recs) > 0
    assert o["timeouts"] == sum(e.outcome == "timeout" for e in recs) > 0
    assert o["ok"] + o["errors"] + o["timeouts"] + o["cancelled"] == len(recs)


def test_conditions(rec: tuple[Path, list[Event], dict[str, Any]]) -> None:
    _, events, r = rec
    c = r["conditions"]
    recs = [e for e in events if isinstance(e, RequestRecord)]
    assert c["upstream"] == "http://gpu-box:8000/v1" and c["models"] == {"m-8b": 400}
    assert c["slo"] == SLO and c["requests"] == 400
    prompts = sorted(e.prompt_tokens or 0 for e in recs)
    assert c["prompt_tokens"]["min"] == prompts[0] and c["prompt_tokens"]["max"] == prompts[-1]
    assert c["prompt_tokens"]["p50"] == prompts[int(0.5 * 400 + 0.5) - 1]  # exact < 2048
    assert c["concurrency_at_start"]["min"] == 1 and c["concurrency_at_start"]["max"] == 8
    # over the recording's span, as THROUGHPUT's requests/s (the recorder starts ~10 s first)
    assert c["arrival"]["rps_mean"] == pytest.approx(400 / c["duration_s"])
    assert c["arrival"]["rps_mean"] == pytest.approx(r["throughput"]["rps"])
    assert 115 < c["duration_s"] < 135
    assert c["extra"] == {"note": "<b>bold</b>"}
    assert r["warnings"][0]["code"] == "QUEUEING"
    assert r["warnings"][0]["duration_s"] == pytest.approx(0.3 * 120)
    g = r["gpus"][0]
    assert g["mem_used_peak_bytes"] == 99 * 2**30 and g["dram_bw_util_peak"] == 89.0
    assert len(r["gpus"]) == 2 and r["engine"]["kv_cache_usage_max"] == 0.99
    assert len(r["series"]) >= 10 and r["series"][-1]["t"] > 100
    by = {b["concurrency"]: b for b in r["by_concurrency"]}
    assert by[1]["ttft_p95"] < by[8]["ttft_p95"]  # latency grows with load
    json.dumps(r, allow_nan=False)  # JSON-safe


def test_text_report_has_every_section(rec: tuple[Path, list[Event], dict[str, Any]]) -> None:
    text = render_text(rec[2])
    for heading in ("CONDITIONS", "LATENCY", "THROUGHPUT", "PER USER", "ERRORS AND TIMEOUTS",
                    "SLO AND GOODPUT", "CAPACITY AT SLO", "WARNINGS", "GPU (peaks)"):
        assert heading in text
    assert text.index("CONDITIONS") < text.index("LATENCY")  # conditions first
    for needle in ("TTFT", "ITL", "chunk gap", "TPOT", "E2E", "QUEUEING", "m-8b",
                   "gpu-box:8000", "timeouts"):
        assert needle in text


def test_html_report_is_self_contained_and_escaped(
        rec: tuple[Path, list[Event], dict[str, Any]]) -> None:
    page = render_html(rec[2])
    for plot_id in PLOTS:
        assert f'id="{plot_id}"' in page
    assert page.count("<svg") == len(PLOTS)
    assert "<script" not in page.replace("&lt;script", "")  # no scripts, user text escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    for fetch in ('src="http', "src='http", 'href="http', "url(http", "@import", "<link"):
        assert fetch not in page  # nothing is fetched from the network


def test_empty_recording_reports_na(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    write_recording(path, [])
    r = analyse(path)
    assert r["conditions"]["requests"] == 0 and r["latency"]["ttft"]["p95"] is None
    text = render_text(r)
    assert "n/a" in text and "no GPU readings" in text
    page = render_html(r)
    assert page.count("<svg") == len(PLOTS)


def _variant(tmp_path: Path, name: str, **kw: Any) -> dict[str, Any]:
    path = tmp_path / name
    write_recording(path, session(200, duration_s=60, **kw),
                    header={"upstream": "http://u", "slo": kw.pop("slo", SLO)})
    return analyse(path)


def test_comparison_warns_when_conditions_differ(tmp_path: Path) -> None:
    a = _variant(tmp_path, "a.jsonl")
    same = _variant(tmp_path, "a2.jsonl", seed=2)
    assert condition_warnings(a, same) == []
    cmp = comparison(a, same)
    assert cmp["conditions_match"] and all(
        f["ratio_b_over_a"] is not None for f in cmp["figures"][:3])

    b = _variant(tmp_path, "b.jsonl", model="m-70b", prompt_mean=400, max_conc=24)
    warnings = condition_warnings(a, b)
    assert any(w.startswith("different models") for w in warnings)
    assert any(w.startswith("different input length") for w in warnings)
    assert any(w.startswith("different concurrency ranges") for w in warnings)
    cmp = comparison(a, b)
    assert not cmp["conditions_match"]
    assert all(f["ratio_b_over_a"] is None for f in cmp["figures"])


def test_report_cli_formats_and_comparison(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    write_recording(a, session(150, duration_s=40))
    write_recording(b, session(150, duration_s=40, model="other-model", prompt_mean=300))
    assert main(["report", str(a), "-q"]) == 0
    assert "CONDITIONS" in capsys.readouterr().out
    assert main(["report", str(a), "--format", "json", "-o", str(tmp_path / "a.json")]) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["report_version"] == 1 and doc["conditions"]["requests"] == 150
    assert main(["report", str(a), "--format", "html", "-o", str(tmp_path / "a.html"),
                 "-q"]) == 0
    assert (tmp_path / "a.html").read_text().count("<svg") == len(PLOTS)
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the recordings were made under different conditions" in out
    assert "different models: A m-8b; B other-model" in out
    assert "withheld" in out
    assert main(["report", str(a), str(b), "--format", "json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["conditions_match"] is False and len(doc["reports"]) == 2
    assert main(["report", str(a), str(b), "--format", "html", "-o",
                 str(tmp_path / "c.html"), "-q"]) == 0
    page = (tmp_path / "c.html").read_text()
    assert 'id="condition-warnings"' in page and 'id="plot-compare-knee"' in page
    # SLO override: a stricter TTFT lowers attainment
    assert main(["report", str(a), "--format", "json", "--slo-ttft", "0.06", "-q"]) == 0
    strict = json.loads(capsys.readouterr().out)
    assert strict["slo"]["ttft_s"] == 0.06
    assert strict["slo"]["attainment"] < doc["reports"][0]["slo"]["attainment"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["MISSING"], "no such file"),
        (["NOTREC"], "not an llmtop recording"),
        (["REC", "-o", "/nonexistent-dir/r.txt"], "does not exist"),
        (["REC", "-o", "TMP"], "is a directory"),
        (["REC", "--slo-target", "1.5"], "--slo-target must be in (0, 1]"),
        (["REC", "REC", "--slo-ttft", "-1"], "--slo-ttft must be a finite number above 0"),
        (["V2"], "newer than this llmtop reads"),
    ],
)
def test_report_cli_mistakes_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    argv: list[str], message: str) -> None:
    rec_path = tmp_path / "r.jsonl"
    write_recording(rec_path, session(5, duration_s=2))
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "v2.jsonl").write_text(
        '{"type":"header","format":"llmtop-recording","version":2}\n')
    subst = {"MISSING": str(tmp_path / "missing.jsonl"), "NOTREC": str(tmp_path / "notes.txt"),
             "REC": str(rec_path), "TMP": str(tmp_path), "V2": str(tmp_path / "v2.jsonl")}
    assert main(["report", *[subst.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_requests_cancelled_on_track_do_not_fail_capacity(tmp_path: Path) -> None:
    """A load generator ends each level by cancelling what is still streaming; those
    requests were within every objective, so they must not read as misses (they made the
    report say capacity 16 for a run whose every level held the SLOs up to 64)."""
    import dataclasses

    events = session(240, max_conc=4, errors_every=0, timeouts_every=0)
    n_cancelled = 0
    for i, e in enumerate(events):
        if isinstance(e, RequestRecord) and i % 3 == 0:
            events[i] = dataclasses.replace(e, outcome="cancelled", status=200)
            n_cancelled += 1
    path = tmp_path / "c.jsonl.gz"
    write_recording(path, events, header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    r = analyse(path)
    assert r["outcomes"]["cancelled"] == n_cancelled > 40
    assert r["slo"]["attainment"] == 1.0
    full = [b["concurrency"] for b in r["by_concurrency"] if b["requests"] >= 30]
    assert full and r["capacity"]["max_concurrency_at_slo"] == max(full)  # not 0
    assert {b["slo_attainment"] for b in r["by_concurrency"]} <= {1.0, None}  # None: 0 judged
    assert r["capacity"]["first_failing_concurrency"] is None
    assert "no level failed: the limit may be higher" in render_text(r)
    assert "no level failed: the limit may be higher" in render_html(r)
    # a cancel after a slow start is a user giving up: it counts, and fails
    slow = next(i for i, e in enumerate(events)
                if isinstance(e, RequestRecord) and e.outcome == "ok")
    events[slow] = dataclasses.replace(events[slow], outcome="cancelled",  # type: ignore[arg-type]
                                       ttft_s=None, e2e_s=0.9, chunk_offsets_s=(),
                                       chunk_tokens=(), completion_tokens=None)
    path2 = tmp_path / "d.jsonl.gz"
    write_recording(path2, events, header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    r2 = analyse(path2)
    judged = sum(isinstance(e, RequestRecord) and e.outcome == "ok" for e in events) + 1
    assert r2["slo"]["attainment"] == pytest.approx((judged - 1) / judged)


def test_capacity_below_a_failing_level_is_said_as_such(
        rec: tuple[Path, list[Event], dict[str, Any]]) -> None:
    _, _, r = rec
    below = dict(r, capacity={"max_concurrency_at_slo": None, "first_failing_concurrency": 14,
                              "min_requests_per_bin": 20, "goodput_tps_at_slo": None})
    assert "below 14: the SLOs fail there" in render_text(below)
    assert "Below <b>14</b>: the SLOs fail there" in render_html(below)


def test_header_objects_read_as_words_and_bench_steps_are_known(tmp_path: Path) -> None:
    """A bench recording's header printed as a Python dict (`bench {'mode': ...}`), and its
    bench_step lines are llmtop's own, not lines of an unknown type."""
    from llmtop.recording.reader import RecordingReader

    path = tmp_path / "b.jsonl"
    bench = {"mode": "concurrency", "levels": [1.0, 2.0, 4.0], "search": False,
             "requests": None, "workload": {"prompt_tokens": "128", "seed": 0},
             "arrivals": "poisson"}
    write_recording(path, session(20, duration_s=4),
                    header={"upstream": "http://u", "slo": SLO, "source": "bench",
                            "bench": bench})
    lines = path.read_text().splitlines()
    step = {"type": "bench_step", "t": 1.0, "level": 1, "latency": {"ttft": {"p50": 0.1}}}
    path.write_text("\n".join([*lines[:5], json.dumps(step), *lines[5:]]) + "\n")
    with RecordingReader(path) as rd:
        assert len(list(rd)) == 20 + 5 * 2 + 2 and rd.unknown_lines == 0
        assert rd.bench_steps == [step] and rd.problems == []
    r = analyse(path)
    want = ("mode concurrency; levels 1, 2, 4; search no; requests n/a; "
            "workload (prompt_tokens 128, seed 0); arrivals poisson")
    text = render_text(r)
    assert f"  bench           {want}\n" in text and "{" not in text
    assert "  file " not in text  # nothing skipped: no file note
    assert f"<td>bench</td><td>{want}</td>" in render_html(r)


def test_capacity_names_the_levels_too_thin_to_count(tmp_path: Path) -> None:
    """QA: the capacity line said "≈ 4" beside higher levels that all met the SLOs, with
    nothing saying why those were left out (each had under 20 judged requests)."""
    import dataclasses

    events = session(120, max_conc=4, errors_every=0, timeouts_every=0)
    fast = [e for e in events if isinstance(e, RequestRecord) and e.concurrency_at_start == 1]
    extra = [dataclasses.replace(e, id=f"thin-{level}-{k}", concurrency_at_start=level)
             for level in (6, 8) for k, e in enumerate(fast[:10])]
    path = tmp_path / "thin.jsonl.gz"
    write_recording(path, events + extra,
                    header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    r = analyse(path)
    levels = {b["concurrency"]: b for b in r["by_concurrency"]}
    assert levels[6]["judged"] == levels[8]["judged"] == 10
    assert levels[6]["slo_attainment"] == levels[8]["slo_attainment"] == 1.0
    best = r["capacity"]["max_concurrency_at_slo"]
    assert isinstance(best, int) and 1 <= best <= 4
    thin = sorted(b["concurrency"] for b in r["by_concurrency"]
                  if b["concurrency"] > best and b["judged"] < 20)
    assert thin[-2:] == [6, 8]
    said = f"levels {', '.join(map(str, thin[:-1]))} and 8: fewer than 20 judged requests"
    for text in (render_text(r), render_html(r)):
        assert said + " each, too few to count" in text, (said, text)
    # nothing to say when every level above counts
    full = tmp_path / "full.jsonl.gz"
    write_recording(full, [e for e in events if not isinstance(e, RequestRecord)
                           or e.concurrency_at_start <= 3],
                    header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    r2 = analyse(full)
    assert r2["capacity"]["max_concurrency_at_slo"] == 3
    assert "too few to count" not in render_text(r2) + render_html(r2)


def test_a_comparison_that_differs_only_in_slos_keeps_the_other_ratios(tmp_path: Path) -> None:
    """QA: the same workload judged against other SLOs had every B/A ratio withheld —
    latency and throughput too, which the SLOs do not touch — "comparing different
    workloads". Only the figures judged against the SLOs lose their ratio now."""
    from llmtop.recording.report.compare import SLO_JUDGED, render_compare_text
    from llmtop.recording.report.html import render_compare_html

    events = session(150, duration_s=40)
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write_recording(a, events, header={"upstream": "http://127.0.0.1:9/v1", "slo": SLO})
    write_recording(b, events, header={"upstream": "http://127.0.0.1:9/v1",
                                       "slo": {**SLO, "ttft_s": 0.2}})
    ra, rb = analyse(a), analyse(b)
    cmp = comparison(ra, rb)
    assert not cmp["conditions_match"] and cmp["slo_only_differs"]
    assert [w.split(":")[0] for w in cmp["warnings"]] == ["different SLOs"]
    ratios = {row["figure"]: row["ratio_b_over_a"] for row in cmp["figures"]}
    assert ratios["TTFT p95"] == pytest.approx(1.0)  # the same requests
    # the same tokens over each recording's own span (its header's started_at, stamped when
    # the recorder starts, to the last event): b started later, by however long writing a
    # took (0.6 s on a loaded CI machine), so the ratio is the spans' ratio, not exactly 1
    span_a, span_b = ra["throughput"]["span_s"], rb["throughput"]["span_s"]
    assert ra["throughput"]["output_tokens"] == rb["throughput"]["output_tokens"]
    assert 0 < span_b <= span_a
    assert ratios["system output tok/s"] == pytest.approx(span_a / span_b, rel=1e-6)
    for label in SLO_JUDGED:
        assert ratios[label] is None, label
    text = render_compare_text(ra, rb)
    assert "judged against different SLOs" in text and "1.00×" in text
    assert "they would compare different workloads" not in text
    html = render_compare_html(ra, rb)
    assert "judged against different SLOs" in html
    # any other difference still withholds every ratio
    c = tmp_path / "c.jsonl.gz"
    write_recording(c, session(150, duration_s=40, model="other-model"),
                    header={"upstream": "http://127.0.0.1:9/v1", "slo": {**SLO, "ttft_s": 0.2}})
    cmp2 = comparison(ra, analyse(c))
    assert not cmp2["slo_only_differs"]
    assert all(row["ratio_b_over_a"] is None for row in cmp2["figures"])
