"""SLO pass/fail per request, attainment and goodput against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metrics_records import Clock, record

from llmtop.config import Config, SloConfig
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.ingest import COUNTERS, ingest
from llmtop.metrics.slo import Slo, meets_slo, request_itl_p95, slo_judged

SLO = Slo(ttft_s=0.5, itl_p95_s=0.05, tpot_s=None, e2e_s=None, target=0.95)


def test_outcome_other_than_ok_fails() -> None:
    for outcome in ("error", "cancelled", "timeout"):
        assert not meets_slo(record(outcome=outcome), SLO)
    assert meets_slo(record(), SLO)


def test_ttft_limit_is_inclusive_and_missing_first_token_fails() -> None:
    assert meets_slo(record(ttft=0.5), SLO)
    assert not meets_slo(record(ttft=0.5001), SLO)
    assert not meets_slo(record(ttft=None), SLO)
    assert meets_slo(record(ttft=None), Slo(ttft_s=None, itl_p95_s=0.05))


def test_itl_p95_uses_the_hdr_rank_over_token_samples() -> None:
    # 20 samples: rank max(int(0.95*20 + 0.5), 1) = 19
    one_slow = record(gaps=[0.01] * 19 + [1.0])
    assert request_itl_p95(one_slow) == pytest.approx(0.01)
    assert meets_slo(one_slow, SLO)
    two_slow = record(gaps=[0.01] * 18 + [1.0, 1.0])
    assert request_itl_p95(two_slow) == pytest.approx(1.0)
    assert not meets_slo(two_slow, SLO)


def test_multi_token_chunks_spread_their_gap_over_their_tokens() -> None:
    # a chunk of 4 tokens after 0.16 s: four ITL samples of 0.04 (passes 0.05)
    r = record(gaps=[0.16, 0.16], tokens=[1, 4, 4])
    assert request_itl_p95(r) == pytest.approx(0.04)
    assert meets_slo(r, SLO)
    # the same stream seen as chunk gaps would look like 0.16 s stutters
    assert r.chunk_gaps_s() == pytest.approx([0.16, 0.16])


def test_single_chunk_has_no_itl_and_passes_it() -> None:
    r = record(gaps=[])
    assert request_itl_p95(r) is None
    assert meets_slo(r, SLO)


def test_tpot_and_e2e_limits() -> None:
    slo = Slo(ttft_s=None, itl_p95_s=None, tpot_s=0.03, e2e_s=1.0)
    assert meets_slo(record(gaps=[0.02] * 9), slo)
    assert not meets_slo(record(gaps=[0.04] * 9), slo)  # TPOT 0.04
    assert not meets_slo(record(ttft=0.9, gaps=[0.02] * 9), slo)  # E2E > 1 s
    assert meets_slo(record(gaps=[], completion_tokens=1), slo)  # TPOT undefined


def test_no_slo_configured_means_ok_outcome() -> None:
    slo = Slo(ttft_s=None, itl_p95_s=None)
    assert meets_slo(record(ttft=30.0, gaps=[5.0]), slo)
    assert not meets_slo(record(outcome="timeout"), slo)


def test_a_cancel_is_judged_only_once_an_objective_is_already_broken() -> None:
    # on track when cancelled: nothing the server did failed it, so it is not counted
    assert not slo_judged(record(outcome="cancelled"), SLO)
    assert not slo_judged(record(outcome="cancelled", ttft=None, e2e_extra=0.3), SLO)
    # a user giving up on a slow server: judged, and (not ok) failed
    assert slo_judged(record(outcome="cancelled", ttft=0.7), SLO)
    assert slo_judged(record(outcome="cancelled", ttft=None, e2e_extra=0.6), SLO)
    assert slo_judged(record(outcome="cancelled", gaps=[0.01] * 4 + [0.5, 0.5]), SLO)
    assert slo_judged(record(outcome="cancelled", e2e_extra=2.0), Slo(e2e_s=1.0))
    # its partial TPOT (which counts the wait before the cancel) is not held against it
    assert not slo_judged(record(outcome="cancelled", gaps=[0.02] * 9, e2e_extra=2.0),
                          Slo(tpot_s=0.03))
    for outcome in ("ok", "error", "timeout"):
        assert slo_judged(record(outcome=outcome), SLO)
        assert slo_judged(record(outcome=outcome), Slo())


gaps_st = st.lists(st.floats(0.0, 0.3, allow_nan=False), max_size=30)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), gaps_st,
                          st.sampled_from(["ok", "ok", "error", "cancelled"]),
                          st.integers(0, 4), st.floats(0.0, 2.0)), min_size=1, max_size=12),
       st.sampled_from([SLO, Slo(0.3, 0.02, 0.03, 2.0), Slo(None, None, None, 0.5)]))
def test_batch_pass_fail_equals_per_request_rule(rows: list, slo: Slo) -> None:
    """The vectorised batch (per-request ITL P95 included) agrees with meets_slo() and
    slo_judged()."""
    recs = []
    rng = np.random.default_rng(len(rows))
    for ttft, gaps, outcome, maxk, tail in rows:
        toks = [int(rng.integers(0, maxk + 1)) if maxk else 1 for _ in range(len(gaps) + 1)]
        recs.append(record(ttft=ttft, gaps=gaps if ttft is not None else [],
                           tokens=toks if ttft is not None else (), outcome=outcome,
                           e2e_extra=tail))
    b = ingest(recs, [2] * len(recs), [3] * len(recs), [0] * len(recs), slo, (4, len(COUNTERS)))
    assert b.met.tolist() == [meets_slo(r, slo) for r in recs]
    assert b.judged.tolist() == [slo_judged(r, slo) for r in recs]
    assert int(b.counters[0, COUNTERS.index("slo_judged")]) == sum(b.judged.tolist())


def test_attainment_and_goodput_match_a_hand_computation() -> None:
    clock = Clock()
    cfg = Config(slo=SloConfig(ttft_s=0.5, itl_p95_s=0.05, target=0.9))
    agg = Aggregator(cfg, clock=clock)
    plan = [
        ("alice", record(user="alice", ttft=0.2, gaps=[0.02] * 9)),  # met, 10 tokens
        ("alice", record(user="alice", ttft=0.7, gaps=[0.02] * 9)),  # TTFT too slow
        ("alice", record(user="alice", ttft=0.2, gaps=[0.02] * 4 + [0.5])),  # ITL p95 0.5
        ("bob", record(user="bob", ttft=0.1, gaps=[0.01] * 19)),  # met, 20 tokens
        ("bob", record(user="bob", outcome="error")),  # error
        ("bob", record(user="bob", ttft=0.3, gaps=[0.02] * 4)),  # met, 5 tokens
    ]
    clock.advance(5.0)
    agg.on_events([r for _, r in plan])
    snap = agg.snapshot(60)
    s = snap["system"]
    span = s["span_s"]
    met = [r for _, r in plan if meets_slo(r, agg.slo)]
    assert len(met) == 3
    assert s["requests"] == 6 and s["slo_met"] == 3 and s["errors"] == 1
    assert s["slo_attainment"] == pytest.approx(3 / 6)
    assert s["goodput_rps"] == pytest.approx(3 / span)
    assert s["goodput_tps"] == pytest.approx((10 + 20 + 5) / span)
    users = {u["user"]: u for u in snap["users"]}
    assert users["alice"]["slo_attainment"] == pytest.approx(1 / 3)
    assert users["alice"]["goodput_tps"] == pytest.approx(10 / span)
    assert users["bob"]["slo_attainment"] == pytest.approx(2 / 3)
    assert users["bob"]["goodput_rps"] == pytest.approx(2 / span)
    assert snap["slo"] == {"ttft_s": 0.5, "itl_p95_s": 0.05, "target": 0.9}


def test_attainment_leaves_out_requests_cancelled_on_track() -> None:
    """A load generator that ends a level cancels the requests still streaming: those
    must not read as SLO misses (they made the report's capacity 16 for a server that held
    the SLOs at 64), while a cancel after a slow start still counts against the server."""
    clock = Clock()
    agg = Aggregator(Config(slo=SloConfig(ttft_s=0.5, itl_p95_s=0.05, target=0.9)),
                     clock=clock)
    plan = [record(user="alice") for _ in range(6)]  # met
    plan += [record(user="alice", outcome="cancelled") for _ in range(3)]  # on track
    plan += [record(user="alice", outcome="cancelled", ttft=None, e2e_extra=0.9)]  # gave up
    plan += [record(user="bob", outcome="cancelled")]  # bob: nothing judged
    clock.advance(5.0)
    agg.on_events(plan)
    snap = agg.snapshot(60)
    s = snap["system"]
    assert s["requests"] == 11 and s["cancelled"] == 5
    assert s["slo_met"] == 6 and s["slo_judged"] == 7
    assert s["slo_attainment"] == pytest.approx(6 / 7)
    users = {u["user"]: u for u in snap["users"]}
    assert users["alice"]["slo_judged"] == 7
    assert users["bob"]["slo_judged"] == 0 and users["bob"]["slo_attainment"] is None
