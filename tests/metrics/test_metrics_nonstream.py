"""Non-streamed responses (``stream`` false) arrive whole: their TTFT is their E2E, so they
add no TTFT/ITL/chunk-gap/TPOT sample and are not judged on the TTFT, ITL or TPOT
objectives — only on E2E and on having no error (QA: a non-streaming llama.cpp workload
read TTFT p50 1.04 s and 0 % SLO attainment while its streamed TTFTs were ~30 ms)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metrics_records import Clock, record
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmtop.config import Config, SloConfig
from llmtop.events import RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.ingest import COUNTERS, ingest
from llmtop.metrics.prometheus import make_registry
from llmtop.metrics.slo import Slo, meets_slo, request_itl_p95, slo_judged


def nonstream(*, user: str = "alice", e2e: float = 1.04, tokens: int = 40,
              outcome: str = "ok", rid: str | None = None) -> RequestRecord:
    """What the proxy records for a JSON (non-streamed) answer: one content event when the
    body is complete, carrying every token; TTFT ≈ E2E."""
    r = record(user=user, ttft=e2e - 0.001, gaps=(), tokens=(tokens,), outcome=outcome,
               rid=rid)
    return dataclasses.replace(r, stream=False)


def slo_cfg(**kw: float) -> Config:
    return Config(slo=SloConfig(**{"ttft_s": None, "itl_p95_s": None, **kw}))  # type: ignore[arg-type]


def test_non_streamed_requests_stay_out_of_the_ttft_histograms() -> None:
    clock = Clock()
    agg = Aggregator(slo_cfg(ttft_s=0.5, itl_p95_s=0.05), clock=clock)
    streamed = [record(user="alice", ttft=0.03) for _ in range(5)]
    whole = [nonstream(user="bob") for _ in range(5)]
    clock.advance(5.0)
    agg.on_events(streamed + whole)
    snap = agg.snapshot(60)
    lat = snap["latency"]
    # TTFT and TPOT only from the streamed five; E2E from all ten
    assert lat["ttft"]["count"] == 5
    assert lat["ttft"]["max"] == pytest.approx(0.03, rel=1e-2)
    assert lat["tpot"]["count"] == 5
    assert lat["e2e"]["count"] == 10
    assert lat["e2e"]["max"] == pytest.approx(1.04, rel=1e-2)
    # TTFT/ITL do not apply to bob's requests: they meet the SLOs (no error, no E2E limit)
    s = snap["system"]
    assert s["slo_met"] == 10 and s["slo_judged"] == 10
    assert s["slo_attainment"] == pytest.approx(1.0)
    users = {u["user"]: u for u in snap["users"]}
    assert users["bob"]["ttft_p95"] is None  # no TTFT sample: n/a, not 1.04 s
    assert users["bob"]["slo_attainment"] == pytest.approx(1.0)
    assert users["alice"]["ttft_p95"] == pytest.approx(0.03, rel=1e-2)
    # Prometheus reads the same tables
    text = generate_latest(make_registry(agg)).decode()
    counts = {(s.name, s.labels.get("user")): s.value
              for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert counts[("llmtop_ttft_seconds_count", None)] == 5
    assert counts[("llmtop_e2e_seconds_count", None)] == 10
    assert ("llmtop_user_ttft_seconds_count", "bob") not in counts or \
        counts[("llmtop_user_ttft_seconds_count", "bob")] == 0


def test_e2e_and_errors_still_judge_a_non_streamed_request() -> None:
    e2e_slo = Slo(ttft_s=0.5, e2e_s=1.0)
    assert meets_slo(nonstream(e2e=0.9), e2e_slo)
    assert not meets_slo(nonstream(e2e=1.04), e2e_slo)  # over the E2E limit
    assert not meets_slo(nonstream(e2e=0.9, outcome="error"), e2e_slo)
    ttft_only = Slo(ttft_s=0.5)
    assert meets_slo(nonstream(e2e=3.0), ttft_only)  # TTFT not applicable
    assert not meets_slo(record(ttft=3.0), ttft_only)  # a streamed one is judged on it
    # TPOT does not apply either: (E2E − TTFT)/(n − 1) of a whole body is no token pace
    assert nonstream().tpot_s() is None
    assert meets_slo(nonstream(e2e=0.9), Slo(tpot_s=1e-6))


def test_non_streamed_body_timing_is_not_an_itl() -> None:
    """Even a non-streamed record with several content events (a body read in pieces) has
    no ITL: its pieces are network reads, not tokens."""
    r = dataclasses.replace(record(ttft=0.2, gaps=[0.5, 0.5]), stream=False)
    assert request_itl_p95(r) is None
    assert meets_slo(r, Slo(itl_p95_s=0.05))
    b = ingest([r], [2], [3], [0], Slo(itl_p95_s=0.05), (4, len(COUNTERS)))
    assert b.met.tolist() == [True]
    agg = Aggregator(slo_cfg(itl_p95_s=0.05), clock=Clock())
    agg.on_events([r])
    lat = agg.snapshot(None)["latency"]
    assert lat["itl"]["count"] == lat["chunk_gap"]["count"] == lat["ttft"]["count"] == 0
    assert lat["e2e"]["count"] == 1


def test_a_cancelled_non_streamed_request_is_not_judged_on_ttft() -> None:
    clock = Clock()
    agg = Aggregator(slo_cfg(ttft_s=0.5), clock=clock)
    # cancelled after 2 s with no answer yet: a streamed request had broken TTFT ≤ 0.5 s
    # by then (judged, failed); a non-streamed one had not broken anything it is judged on
    streamed = record(ttft=None, outcome="cancelled", e2e_extra=1.95)
    whole = dataclasses.replace(record(ttft=None, outcome="cancelled", e2e_extra=1.95),
                                stream=False)
    assert slo_judged(streamed, agg.slo) and not slo_judged(whole, agg.slo)
    clock.advance(5.0)
    agg.on_events([streamed, whole, nonstream()])
    s = agg.snapshot(60)["system"]
    assert s["cancelled"] == 2 and s["slo_judged"] == 2 and s["slo_met"] == 1
    # on E2E it is judged: cancelled past the E2E limit is a user giving up on a slow server
    assert slo_judged(whole, Slo(ttft_s=0.5, e2e_s=1.0))


gaps_st = st.lists(st.floats(0.0, 0.3, allow_nan=False), max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), gaps_st,
                          st.sampled_from(["ok", "ok", "error", "cancelled"]),
                          st.booleans(), st.floats(0.0, 2.0)), min_size=1, max_size=12),
       st.sampled_from([Slo(0.5, 0.05), Slo(0.3, 0.02, 0.03, 2.0), Slo(0.2, None, None, 0.5),
                        Slo(None, None, 0.01, None)]))
def test_batch_agrees_with_the_per_request_rule_for_mixed_streaming(
        rows: list, slo: Slo) -> None:
    """ingest's vectorised pass/fail and judged flags equal meets_slo()/slo_judged() when
    streamed and non-streamed requests are mixed; the TTFT histogram holds exactly the
    streamed requests that have a first token."""
    recs = []
    for ttft, gaps, outcome, streamed, tail in rows:
        r = record(ttft=ttft, gaps=gaps if ttft is not None else [], outcome=outcome,
                   e2e_extra=tail)
        recs.append(r if streamed else dataclasses.replace(r, stream=False))
    n = len(recs)
    b = ingest(recs, [2] * n, [3] * n, [0] * n, slo, (4, len(COUNTERS)))
    assert b.met.tolist() == [meets_slo(r, slo) for r in recs]
    assert b.judged.tolist() == [slo_judged(r, slo) for r in recs]
    agg = Aggregator(slo_cfg(), clock=Clock())
    agg.on_events(recs)
    lat = agg.snapshot(None)["latency"]
    assert lat["ttft"]["count"] == sum(r.stream and r.ttft_s is not None for r in recs)
    assert lat["itl"]["count"] == sum(sum(r.chunk_tokens[1:]) for r in recs if r.stream)
    assert lat["chunk_gap"]["count"] == sum(
        max(len(r.chunk_offsets_s) - 1, 0) for r in recs if r.stream)
    assert np.all(b.e2e_s == np.array([r.e2e_s for r in recs]))
