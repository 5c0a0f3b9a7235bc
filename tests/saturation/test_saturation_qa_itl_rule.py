"""QA: SLO_ITL judged a request's ITL P95 by numpy's linear interpolation, the metrics by
the HDR rank rule (``llmtop.metrics.slo``). Streams of 20 tokens at 20 ms with one 0.5 s
stall each (another request's prefill) meet ``ITL p95 ≤ 50 ms`` by the SLO's definition —
the snapshot's attainment is 100 % — yet SLO_ITL was raised: "met by 20 % of the last 250
answered requests". The warning now judges each request as the metrics do."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, healthy_traffic, record

from llmtop.config import load_config
from llmtop.metrics.slo import Slo, meets_slo
from llmtop.saturation import SaturationMonitor

ONE_STALL = [0.02] * 9 + [0.5] + [0.02] * 9
TWO_STALLS = [0.02] * 8 + [0.5, 0.5] + [0.02] * 9


def _run(gaps: list[float]) -> Harness:
    h = Harness()
    healthy_traffic(h, 10)
    for _ in range(40):
        h.feed(*[record(h.now - 1.0 + i * 0.1, gaps=gaps) for i in range(5)])
        h.step()
    return h


def test_one_stall_per_stream_meets_the_itl_slo_and_raises_nothing() -> None:
    slo = Slo.from_config(load_config(None, env={}))
    assert meets_slo(record(0.0, gaps=ONE_STALL), slo)  # what the snapshot counts
    h = _run(ONE_STALL)
    assert "SLO_ITL" not in h.codes(), h.mon.raised()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "itl")
    assert att == 1.0 and n > 0


def test_two_stalls_per_stream_miss_it_in_both() -> None:
    slo = Slo.from_config(load_config(None, env={}))
    assert not meets_slo(record(0.0, gaps=TWO_STALLS), slo)
    h = _run(TWO_STALLS)
    assert "SLO_ITL" in h.codes()


def test_itl_at_exactly_the_limit_meets_it() -> None:
    """ITL ≤ the limit: a P95 equal to it meets it (binary-exact figures: 62.5 ms gaps
    after a 125 ms TTFT, so the offsets' differences are exactly 62.5 ms)."""
    h = Harness()
    cfg = load_config(None, env={}, overrides={"slo.itl_p95_s": 0.0625})
    h.mon = SaturationMonitor(cfg, h.events.append, h.active, upstream_down=lambda: h.down)
    for _ in range(30):
        h.feed(*[record(h.now - 2.0, ttft=0.125, gaps=[0.0625] * 19) for _ in range(5)])
        h.step()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "itl")
    assert "SLO_ITL" not in h.codes() and att == 1.0 and n > 0


def test_a_non_streamed_answer_has_no_itl_to_miss() -> None:
    h = Harness()
    for _ in range(30):
        whole = [dataclasses.replace(record(h.now - 1.0, gaps=[0.5] * 4), stream=False)
                 for _ in range(5)]
        h.feed(*whole)
        h.step()
    assert "SLO_ITL" not in h.codes(), h.mon.raised()
