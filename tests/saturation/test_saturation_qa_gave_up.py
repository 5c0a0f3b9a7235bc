"""QA: requests their clients cancelled after an objective was already broken (no first
token after 2 s against a 0.5 s TTFT limit: the user gave up on a slow server) are judged
and fail in the snapshot's SLO attainment (``llmtop.metrics.slo``), but the SLO_* warnings
looked at answered requests only. With impatient clients on a saturated engine every
request was given up: attainment 0 % in the snapshot, and SLO_TTFT never raised; with some
surviving, the survivors (the quickest) made the warning's figure read better than the
snapshot's. A cancelled request now counts against each objective it had broken (and is
left out of the others), as in the metrics."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, healthy_traffic, record

from llmtop.config import load_config
from llmtop.events import RequestRecord
from llmtop.metrics.slo import Slo, meets_slo, slo_judged


def gave_up(t_start: float, after_s: float = 2.0) -> RequestRecord:
    """Cancelled by its client after ``after_s`` without a first token."""
    return dataclasses.replace(record(t_start), outcome="cancelled", ttft_s=None,
                               e2e_s=after_s, chunk_offsets_s=(), chunk_tokens=(),
                               completion_tokens=None, status=499)


def cancelled_on_track(t_start: float) -> RequestRecord:
    """Cancelled mid-stream while within every objective (a load generator stopping)."""
    return dataclasses.replace(record(t_start, n=5), outcome="cancelled")


def test_every_request_given_up_raises_slo_ttft() -> None:
    slo = Slo.from_config(load_config(None, env={}))
    r = gave_up(0.0)
    assert slo_judged(r, slo) and not meets_slo(r, slo)  # what the snapshot counts
    h = Harness()
    healthy_traffic(h, 10)
    for _ in range(30):
        h.feed(*[gave_up(h.now - 2.5) for _ in range(3)])
        h.step()
    assert "SLO_TTFT" in h.codes(), h.mon.raised()
    msg = h.mon.raised()["SLO_TTFT"]
    assert "cancelled by their clients" in msg, msg
    assert "SLO_ITL" not in h.codes() and "ERRORS" not in h.codes(), h.mon.raised()


def test_the_warnings_attainment_counts_the_given_up_as_the_snapshot_does() -> None:
    h = Harness()
    for _ in range(20):
        h.feed(*[record(h.now - 1.0, ttft=0.1) for _ in range(2)],
               *[gave_up(h.now - 2.5) for _ in range(2)])
        h.step()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "ttft")
    assert n == 80 and att == 0.5
    itl, n_itl = h.mon.signals.slo_attainment(h.now, 60, "itl")
    assert itl == 1.0 and n_itl == 40  # given up before any token: no ITL broken


def test_cancelled_on_track_is_not_judged() -> None:
    h = Harness()
    for _ in range(30):
        h.feed(*[record(h.now - 1.0, ttft=0.1) for _ in range(2)],
               *[cancelled_on_track(h.now - 1.0) for _ in range(3)])
        h.step()
    att, n = h.mon.signals.slo_attainment(h.now, 60, "ttft")
    assert att == 1.0 and n == 60
    assert h.codes() == []
