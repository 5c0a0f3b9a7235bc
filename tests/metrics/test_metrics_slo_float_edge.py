"""An ITL exactly at its objective meets it. Chunk times are float seconds since the
request's start, so chunks written exactly 50,000,000 ns apart from 0.09 s on differ by
0.05000000000000002 s, and a request whose every gap was exactly 50 ms missed a 50 ms
ITL p95 objective — in the live attainment, the per-request judgement and the
saturation monitor alike (they agree, and now agree that it is met)."""

from __future__ import annotations

from metrics_records import T0, Clock

from llmtop.config import load_config
from llmtop.events import RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.slo import Slo, meets_slo, request_itl_p95
from llmtop.metrics.snapshot import build_snapshot
from llmtop.saturation import SaturationMonitor

NS = [90_000_000 + 50_000_000 * i for i in range(20)]  # every gap exactly 50 ms


def _rec(i: int) -> RequestRecord:
    offs = [n / 1e9 for n in NS]  # as the proxy turns its ns stamps into the record's
    return RequestRecord(
        id=f"r{i}", user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=T0 + i, ttft_s=offs[0],
        e2e_s=offs[-1] + 0.001, prompt_tokens=10, completion_tokens=len(offs),
        token_source="usage", chunk_offsets_s=offs, chunk_tokens=[1] * len(offs))


def test_a_gap_of_exactly_the_objective_meets_it_everywhere() -> None:
    r = _rec(0)
    p95 = request_itl_p95(r)
    assert p95 is not None and p95 > 0.05  # the float difference is over by an ulp
    cfg = load_config(None, env={}, overrides={"slo.itl_p95_s": 0.05, "slo.ttft_s": None,
                                               "slo.e2e_s": None, "slo.tpot_s": None})
    slo = Slo.from_config(cfg)
    assert meets_slo(r, slo)

    clock = Clock(T0 + 30)
    agg = Aggregator(cfg, {}, clock=clock)
    agg.on_events([_rec(i) for i in range(10)])
    agg.tick()
    system = build_snapshot(agg, 60)["system"]
    assert system["slo_judged"] == 10 and system["slo_met"] == 10

    mon = SaturationMonitor(cfg, lambda ev: None)
    mon.on_events([_rec(i) for i in range(10)])
    share, judged = mon.signals.slo_attainment(T0 + 30, 60, "itl")
    assert judged == 10 and share == 1.0
