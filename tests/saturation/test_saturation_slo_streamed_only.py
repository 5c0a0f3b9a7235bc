"""SLO_TTFT and SLO_ITL judge the requests those objectives apply to: a non-streamed
answer has no first token and no pace of tokens (``llmtop.metrics.slo``: it is judged on
E2E and its outcome only), so it must not count as having met TTFT or ITL. Counted as
met, a batch workload's whole answers diluted the interactive streams' misses: every
streamed request missing its TTFT read "met by 96 %" beside 24 non-streamed answers each,
and SLO_TTFT never raised."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, record

from llmtop.config import load_config
from llmtop.events import RequestRecord
from llmtop.saturation import SaturationMonitor


def whole(t_start: float) -> RequestRecord:
    """A fast non-streamed answer (its body in one piece after 0.2 s)."""
    r = record(t_start, ttft=0.2, n=1)
    return dataclasses.replace(r, stream=False, id=f"w{t_start}-{id(r)}")


def test_slow_first_tokens_beside_whole_answers_raise_slo_ttft() -> None:
    h = Harness()
    for _ in range(60):
        h.feed(*[whole(h.now - 1.0) for _ in range(24)],
               record(h.now - 3.0, ttft=2.0))  # TTFT 2 s against 0.5 s: a miss
        h.step()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "ttft")
    # the streamed ones of the last minute (to the slice), each a miss
    assert att == 0.0 and 55 <= n <= 61, (att, n)
    assert "SLO_TTFT" in h.codes(), h.mon.raised()
    assert f"met by 0% of the last {n} answered" in h.mon.raised()["SLO_TTFT"]
    e2e, n_e2e = h.mon.signals.slo_attainment(h.now, 60, "e2e")
    assert n_e2e == 0 and e2e is None  # no E2E objective by default: nothing judged


def test_stalling_streams_beside_whole_answers_raise_slo_itl() -> None:
    h = Harness()
    for _ in range(60):
        h.feed(*[whole(h.now - 1.0) for _ in range(24)],
               record(h.now - 3.0, gaps=[0.5] * 19))  # ITL p95 0.5 s against 0.05 s
        h.step()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "itl")
    assert att == 0.0 and 55 <= n <= 61, (att, n)
    assert "SLO_ITL" in h.codes(), h.mon.raised()


def test_whole_answers_alone_are_judged_on_e2e_only() -> None:
    h = Harness()
    cfg = load_config(None, env={}, overrides={"slo.e2e_s": 0.1})
    h.mon = SaturationMonitor(cfg, h.events.append, h.active, upstream_down=lambda: h.down)
    for _ in range(30):
        h.feed(*[whole(h.now - 1.0) for _ in range(5)])  # 0.2 s answers: E2E misses
        h.step()
    assert h.mon.signals.slo_attainment(h.now, 60, "ttft") == (None, 0)
    assert h.mon.signals.slo_attainment(h.now, 60, "itl") == (None, 0)
    att, n = h.mon.signals.slo_attainment(h.now, 60, "e2e")
    assert att == 0.0 and n >= 140, (att, n)
    assert "SLO_E2E" in h.codes() and "SLO_TTFT" not in h.codes()
