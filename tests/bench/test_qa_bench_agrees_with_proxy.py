"""QA: one run seen three ways — ``llmtop bench`` at the client, ``llmtop run`` at its
socket, ``llmtop sim`` inside the engine — must tell the same story.

The chain: ``llmtop sim`` (profile tiny with two sequence slots, so concurrency 4 really
queues) ← ``llmtop run --headless --record R`` ← three ``llmtop bench`` runs through the
proxy: closed loop at concurrency 1 and 4; open loop at 10 req/s with ``X-Sim-Fault:
disconnect-after:10`` and a mix of output lengths, so the longest answers break mid-stream
and the rest succeed; and three requests the engine refuses with ``status:503``. The engine
packs three tokens into an event (as speculative decoding does), so a stream broken before
its usage must be estimated, not counted one token per event.

What must hold, by the definitions in shared/docs/domain.md:

* counts (requests, ok, errors) and tokens (completion and prompt, per request and summed)
  are equal in every view, and match the engine's own usage;
* a request's proxy interval lies inside its client interval (the proxy reads the request
  after the client sent it and writes each chunk before the client reads it), so at every
  rank the proxy's TTFT and E2E are ≤ the client's — exactly, no tolerance; and they are
  *close*: within ``HOP_S``. Two loopback hops through two processes measured 1–5 ms here;
  ``HOP_S`` leaves twenty times that for a busy 2-core machine yet is a third of the
  ~0.3 s that queueing adds at concurrency 4, so a TTFT that left out queueing (or counted
  it twice) fails;
* TPOT = (E2E − TTFT) / (n − 1) moves by at most ``HOP_S / (n − 1)`` between the views;
* SLO attainment and goodput are computed the same way: a TTFT objective met at the client
  is met at the proxy (never the other way round for more than the requests within
  ``HOP_S`` of the limit); bench's goodput × duration is the tokens of the requests it
  judged met; the admin snapshot, ``/metrics`` and ``llmtop report`` of the recording agree
  with each other exactly.

Rates are over different spans (bench: each level's measured duration; the snapshot: the
session until now; the report: the recording's first to last request), so they are compared
as counts (rate × span), never as rates.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from views_agree import (
    BenchRun,
    Level,
    bench,
    completion_sum,
    get_json,
    get_text,
    llmtop_cmd,
    prom_values,
    prompt_sum,
    quiet_env,
    report,
    requests_of,
    split_by_level,
    start_proxy,
    start_sim,
)

from llmtop.events import RequestRecord
from llmtop.metrics.hdr import Histogram
from llmtop.metrics.slo import Slo, meets_slo

pytestmark = pytest.mark.timeout(180)

HOP_S = 0.1
"""Most a client's TTFT or E2E may exceed the proxy's for the same request (see above)."""
SLO_TTFT_S = 0.2
"""Met by a request served at once (~0.03 s), missed by one queued behind a whole answer at
concurrency 4 (~0.3 s)."""
SLO_ITL_S = 1.0
"""Generous: a per-request ITL p95 has no order between client and proxy (a client read
can merge two chunks), so only TTFT, which has one, sits where requests fall both sides."""
SLO = Slo(ttft_s=SLO_TTFT_S, itl_p95_s=SLO_ITL_S, target=0.9)
SLO_FLAG = f"ttft={SLO_TTFT_S},itl_p95={SLO_ITL_S},target=0.9"
PROMPT = 64
PACK = 3
"""Tokens per stream event (as speculative decoding packs them): the first event carries
one, each later one PACK (the last fewer, unless the length is 1 + k × PACK)."""
BREAK_AT = 10
"""Events after which the faulty level's streams are cut off."""
SHORT, WHOLE, LONG, ALONE = 10, 22, 40, 61
"""The faulty level's output lengths: 4 and 8 events (complete), and 14, cut off after
BREAK_AT events = 1 + 9 × PACK = 28 tokens. 22 = 1 + 7 × PACK teaches exactly PACK tokens
per event (8 events, the least a stream may teach from); 10 has too few events to teach.
The closed-loop levels ask for ALONE = 1 + 20 × PACK (21 events, ~0.3 s alone)."""
CUT = 1 + (BREAK_AT - 1) * PACK
REQUESTS = 10 + 10 + 14 + 3


@dataclass
class Views:
    runs: list[BenchRun]
    levels: list[Level]
    refused: list[dict[str, Any]]
    """bench's records of the three requests the engine refused (503)."""
    proxy: list[dict[str, Any]]
    snapshot: dict[str, Any]
    metrics: dict[str, float]
    report: dict[str, Any]
    truth: list[dict[str, Any]]
    """The simulator's own records (``/sim/requests``)."""
    bench_report: dict[str, Any]
    """``llmtop report --format json`` of bench's recording of the faulty level."""
    proxy_exit: int


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Views]:
    d = tmp_path_factory.mktemp("agree")
    sim, sim_url = start_sim("--profile", "tiny", "--set", "max_num_seqs=2",
                             "--set", f"tokens_per_chunk={PACK}", "--seed", "1")
    workload = d / "mix.jsonl"
    workload.write_text("".join(f'{{"prompt_tokens": {PROMPT}, "max_tokens": {n}}}\n'
                                for n in (SHORT, WHOLE, LONG)))
    try:
        proxy, url, admin = start_proxy(
            sim_url, d / "R.jsonl", LLMTOP_SLO_TTFT_S=str(SLO_TTFT_S),
            LLMTOP_SLO_ITL_P95_S=str(SLO_ITL_S), LLMTOP_SLO_TARGET="0.9")
        try:
            common = ("--prompt-tokens", str(PROMPT), "--slo", SLO_FLAG)
            closed = bench(url, d / "B1.jsonl", "--concurrency", "1,4", "--requests", "10",
                           "--max-tokens", str(ALONE), *common)
            faulty = bench(url, d / "B2.jsonl", "--rate", "10", "--requests", "14",
                           "--workload", str(workload), "--seed", "2",
                           "--header", f"X-Sim-Fault: disconnect-after:{BREAK_AT}", *common)
            p = subprocess.run(
                llmtop_cmd("bench", url, "--requests", "3", "--max-tokens", "8", *common,
                           "--header", "X-Sim-Fault: status:503",
                           "--record", str(d / "B3.jsonl"), "--json"),
                capture_output=True, text=True, env=quiet_env(), timeout=60, check=False)
            assert p.returncode == 1 and "3 HTTP 503" in p.stderr, p.stderr
            refused = requests_of(d / "B3.jsonl")
            snapshot = settled(admin, REQUESTS)
            metrics = prom_values(asyncio.run(get_text(f"{admin}/metrics")))
            truth = asyncio.run(get_json(f"{sim_url}/sim/requests"))
        finally:
            code = proxy.stop()
    finally:
        sim.stop()
    recorded = requests_of(d / "R.jsonl")
    runs = [closed, faulty]
    bench_part = recorded[:len(recorded) - len(refused)]
    yield Views(runs, split_by_level(runs, bench_part), refused, recorded, snapshot, metrics,
                report(d / "R.jsonl"), truth, report(d / "B2.jsonl"), code)


def settled(admin: str, requests: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """The snapshot (window=all) once every request's record has reached the aggregator."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap: dict[str, Any] = asyncio.run(get_json(f"{admin}/llmtop/v1/snapshot?window=all"))
        if snap["system"]["requests"] >= requests or time.monotonic() > deadline:
            return snap
        time.sleep(0.1)


def record(d: dict[str, Any]) -> RequestRecord:
    fields = {k: v for k, v in d.items() if k != "type"}
    fields["chunk_offsets_s"] = tuple(fields["chunk_offsets_s"])
    fields["chunk_tokens"] = tuple(fields["chunk_tokens"])
    return RequestRecord(**fields)


def ranked(records: list[dict[str, Any]], key: str) -> list[float]:
    return sorted(r[key] for r in records if r[key] is not None)


def tpots(records: list[dict[str, Any]]) -> list[float]:
    return sorted(t for r in records if r["outcome"] == "ok"
                  and (t := record(r).tpot_s()) is not None)


# -- counts ------------------------------------------------------------------------------


def test_request_and_error_counts_agree_per_level_and_overall(views: Views) -> None:
    assert views.proxy_exit == 0
    assert [len(lv.client) for lv in views.levels] == [10, 10, 14]
    for lv in views.levels:
        s = lv.step
        label = f"{s['mode']} {s['level']}"
        assert len(lv.proxy) == len(lv.client) == s["requests"], label
        for outcome, key in (("ok", "ok"), ("error", "errors"), ("timeout", "timeouts")):
            n_proxy = sum(r["outcome"] == outcome for r in lv.proxy)
            n_client = sum(r["outcome"] == outcome for r in lv.client)
            assert n_proxy == n_client == s[key], (label, outcome, n_proxy, n_client, s[key])
        assert sum(s["error_kinds"].values()) == s["errors"] + s["timeouts"], label
    broken = views.levels[2]
    assert broken.step["error_kinds"] == {"response cut off": broken.step["errors"]}
    assert 0 < broken.step["errors"] < broken.step["requests"]  # faults *mixed in*
    assert all(r["outcome"] == "error" and r["status"] == 503 for r in views.refused)
    assert [r["status"] for r in views.proxy[-3:]] == [503] * 3

    ok = sum(r["outcome"] == "ok" for r in views.proxy)
    errors = sum(r["outcome"] == "error" for r in views.proxy)
    system = views.snapshot["system"]
    assert (system["requests"], system["ok"], system["errors"]) == (REQUESTS, ok, errors)
    assert errors == views.levels[2].step["errors"] + 3
    m = views.metrics
    assert m['llmtop_requests_total{outcome="ok"}'] == ok
    assert m['llmtop_requests_total{outcome="error"}'] == errors
    assert m['llmtop_requests_total{outcome="timeout"}'] == 0
    assert m['llmtop_user_requests_total{outcome="ok",user="bench"}'] == ok
    assert m['llmtop_user_requests_total{outcome="error",user="bench"}'] == errors
    (user,) = [u for u in views.snapshot["users"] if u["user"] == "bench"]
    assert user["requests"] == REQUESTS
    out = views.report["outcomes"]
    assert (out["requests"], out["ok"], out["errors"]) == (REQUESTS, ok, errors)
    # the engine saw every request but the three refused before it (status: "nothing
    # reaches the engine")
    assert len(views.truth) == REQUESTS - 3


# -- tokens ------------------------------------------------------------------------------


def test_completion_tokens_agree_request_by_request_and_with_the_engine(views: Views) -> None:
    for lv in views.levels:
        label = f"{lv.step['mode']} {lv.step['level']}"
        client = sorted(r["completion_tokens"] for r in lv.client if r["outcome"] == "ok")
        proxy = sorted(r["completion_tokens"] for r in lv.proxy if r["outcome"] == "ok")
        assert client == proxy, label
        assert lv.step["output_tps"] * lv.step["duration_s"] == pytest.approx(
            completion_sum(lv.client), rel=1e-9)
    # engine truth: every answer that completed got all it asked for, and the engine wrote
    # BREAK_AT events (CUT tokens) of each cut-off one
    assert sorted(t["completion_tokens"] for t in views.truth if t["state"] == "finished") \
        == sorted(r["completion_tokens"] for r in views.proxy if r["outcome"] == "ok")
    cut = [t for t in views.truth if t["max_tokens"] == LONG]
    assert cut and {len(t["chunks"]) for t in cut} == {BREAK_AT}
    assert min(t["completion_tokens"] for t in cut) >= CUT
    # a cut-off stream has no usage: the proxy, which learned PACK tokens an event from
    # the closed-loop levels' complete streams, estimates exactly what was written
    broken = views.levels[2]
    assert [(r["completion_tokens"], r["token_source"]) for r in broken.proxy
            if r["outcome"] == "error"] == [(CUT, "estimate")] * len(cut)
    # bench learns from its own complete streams by the same rule: from the end of its
    # first WHOLE-token answer on it estimates as the proxy does; before, it can only count
    # events (as the proxy would, had it learned nothing). It used to count events always.
    learned = min(end(r) for r in broken.client
                  if r["outcome"] == "ok" and r["completion_tokens"] == WHOLE)
    client_cut = [r for r in broken.client if r["outcome"] == "error"]
    for r in client_cut:
        if abs(end(r) - learned) > 0.001:  # (ends this close could be in either order)
            want = (CUT, "estimate") if end(r) > learned else (BREAK_AT, "chunks")
            assert (r["completion_tokens"], r["token_source"]) == want, (end(r) - learned)
    assert any(r["token_source"] == "estimate" for r in client_cut)  # exercised
    total = sum(r["completion_tokens"] or 0 for r in views.proxy)
    assert views.snapshot["system"]["output_tokens"] == total
    assert views.metrics["llmtop_output_tokens_total"] == total
    assert views.report["throughput"]["output_tokens"] == total


def end(r: dict[str, Any]) -> float:
    return float(r["t_start"] + r["e2e_s"])


def test_prompt_tokens_agree_and_are_the_engines_count(views: Views) -> None:
    """Prompt tokens are the engine's own count (usage) wherever a figure shows them. A
    request without usage — refused, or broken before its usage came — has no count in
    either view (bench recorded its *target* length, 64, where the engine counted 71 and the
    proxy nothing; ``llmtop report`` of bench's recording of three refused requests read
    384 input tokens)."""
    engine_prompt = {t["prompt_tokens"] for t in views.truth}
    assert PROMPT not in engine_prompt  # the chat template adds to what bench asked for
    for lv in views.levels:
        label = f"{lv.step['mode']} {lv.step['level']}"
        assert sorted(r["prompt_tokens"] or 0 for r in lv.client) == \
            sorted(r["prompt_tokens"] or 0 for r in lv.proxy), label
        for side in (lv.client, lv.proxy):
            assert {r["prompt_tokens"] for r in side if r["token_source"] == "usage"} <= \
                engine_prompt, label
            assert {r["prompt_tokens"] for r in side if r["token_source"] != "usage"} <= {None}
        assert lv.step["input_tps"] * lv.step["duration_s"] == pytest.approx(
            prompt_sum(lv.client), rel=1e-9)
    assert [r["prompt_tokens"] for r in views.refused] == [None] * 3
    total = prompt_sum(views.proxy)
    assert views.snapshot["system"]["input_tokens"] == total
    assert views.metrics["llmtop_input_tokens_total"] == total
    assert views.report["throughput"]["input_tokens"] == total


# -- latency -----------------------------------------------------------------------------


def test_proxy_ttft_and_e2e_are_at_most_the_clients_and_close(views: Views) -> None:
    for lv in views.levels:
        label = f"{lv.step['mode']} {lv.step['level']}"
        for key in ("ttft_s", "e2e_s"):
            client, proxy = ranked(lv.client, key), ranked(lv.proxy, key)
            assert len(client) == len(proxy), (label, key)
            gaps = [c - p for c, p in zip(client, proxy, strict=True)]
            assert min(gaps) >= 0, (label, key, gaps)
            assert max(gaps) <= HOP_S, (label, key, gaps)
    # queueing is in both: at concurrency 4 on two slots most requests wait for a whole
    # answer, more than HOP_S (else the bound above could not tell it was left out)
    four = views.levels[1]
    assert ranked(four.proxy, "ttft_s")[5] > 2 * HOP_S


def test_tpot_and_itl_agree(views: Views) -> None:
    for lv in views.levels:
        label = f"{lv.step['mode']} {lv.step['level']}"
        client, proxy = tpots(lv.client), tpots(lv.proxy)
        assert len(client) == len(proxy) == lv.step["latency"]["tpot"]["count"], label
        shortest = min(r["completion_tokens"] for r in lv.client if r["outcome"] == "ok")
        bound = HOP_S / (shortest - 1)
        assert max(abs(c - p) for c, p in zip(client, proxy, strict=True)) <= bound, label
        # ITL: one sample per token after the first chunk's; a client read that merged two
        # chunks gives it fewer, never more
        itl_proxy = sum(len(record(r).itl_samples_s()) for r in lv.proxy)
        assert 0 < lv.step["latency"]["itl"]["count"] <= itl_proxy, label


def test_overall_percentiles_proxy_at_most_client(views: Views) -> None:
    """The proxy's HDR histograms (snapshot, window=all) against bench's, merged over its
    levels: at every percentile the proxy's value is ≤ the client's (HDR bucketing keeps
    order) and within HOP_S (+ 0.1 % bucket width)."""
    steps = [s for run in views.runs for s in run.summary["steps"]]
    for key in ("ttft", "e2e", "tpot"):
        client = Histogram.merged(Histogram.decode(s["histograms"][key]) for s in steps)
        proxy = Histogram.decode(views.snapshot["histograms"][key])
        assert proxy.total == client.total, key
        ps = [1, 10, 25, 50, 75, 90, 95, 99, 100]
        for p, c_us, p_us in zip(ps, client.percentiles(ps), proxy.percentiles(ps),
                                 strict=True):
            if key == "tpot":
                assert abs(c_us - p_us) <= HOP_S * 1e6 / (SHORT - 1) + c_us * 0.002, (key, p)
            else:
                assert p_us <= c_us <= p_us + HOP_S * 1e6 + c_us * 0.002, (key, p, c_us, p_us)
    for key in ("ttft", "itl", "tpot", "e2e"):
        assert views.report["latency"][key] == views.snapshot["latency"][key], key
        lat = views.snapshot["latency"][key]
        assert views.metrics[f"llmtop_{key}_seconds_count"] == lat["count"], key
        assert views.metrics[f"llmtop_{key}_seconds_sum"] == pytest.approx(
            lat["mean"] * lat["count"], rel=1e-6), key


# -- SLOs and goodput --------------------------------------------------------------------


def met(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if meets_slo(record(r), SLO)]


def test_slo_attainment_and_goodput_computed_the_same_way(views: Views) -> None:
    client_met = proxy_met = 0
    for lv in views.levels:
        s = lv.step
        label = f"{s['mode']} {s['level']}"
        c, p = met(lv.client), met(lv.proxy)
        # bench's figures are its own records judged by the SLO rules
        assert s["slo_attainment"] * s["requests"] == pytest.approx(len(c)), label
        assert s["goodput_rps"] * s["duration_s"] == pytest.approx(len(c)), label
        assert s["goodput_tps"] * s["duration_s"] == pytest.approx(completion_sum(c)), label
        # the proxy's TTFT is never later: what the client saw met, the proxy saw met; the
        # proxy may count more only for requests within HOP_S above the limit at the client
        near = sum(1 for r in lv.client if r["outcome"] == "ok" and r["ttft_s"] is not None
                   and SLO_TTFT_S < r["ttft_s"] <= SLO_TTFT_S + HOP_S)
        assert len(c) <= len(p) <= len(c) + near, (label, len(c), len(p), near)
        client_met += len(c)
        proxy_met += len(p)
    assert 0 < client_met < sum(len(lv.client) for lv in views.levels)  # the SLO bites
    system = views.snapshot["system"]
    goodput_tokens = completion_sum(met(views.proxy))
    assert system["slo_met"] == proxy_met == views.report["slo"]["met"]
    assert views.metrics["llmtop_slo_met_requests_total"] == proxy_met
    assert views.metrics["llmtop_slo_judged_requests_total"] == system["requests"]
    assert views.metrics["llmtop_goodput_output_tokens_total"] == goodput_tokens
    assert system["slo_attainment"] == pytest.approx(proxy_met / system["requests"])
    assert views.report["slo"]["attainment"] == pytest.approx(proxy_met / system["requests"])


def test_report_of_benchs_recording_is_benchs_summary(views: Views) -> None:
    """``llmtop report`` of bench's own recording reads what bench printed for the level
    (the same records through the same aggregation): counts, tokens, SLO and latency."""
    s, rep = views.levels[2].step, views.bench_report
    assert (rep["outcomes"]["requests"], rep["outcomes"]["ok"], rep["outcomes"]["errors"]) \
        == (s["requests"], s["ok"], s["errors"])
    assert rep["throughput"]["output_tokens"] == completion_sum(views.levels[2].client)
    assert rep["throughput"]["input_tokens"] == prompt_sum(views.levels[2].client)
    assert rep["slo"]["attainment"] == pytest.approx(s["slo_attainment"])
    for key in ("ttft", "itl", "tpot", "e2e"):
        for p in ("count", "p50", "p90", "p95", "p99", "max"):
            assert rep["latency"][key][p] == s["latency"][key][p], (key, p)
