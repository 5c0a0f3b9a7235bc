"""ERRORS at low traffic: a service below 1 req/s whose every answer is an HTTP 500 is
failing, and says so. The raise asked for 20 requests in the 2 W window (20 s by default)
besides 3 failures and the Wilson bound, so under 1 req/s ERRORS never rose, at any error
rate; the Wilson bound already weighs how little a few requests prove."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, record

from llmtop.events import RequestRecord


def _run(h: Harness, seconds: int, every_s: int, failing: int, of: int) -> None:
    """One request every ``every_s`` seconds; ``failing`` in each ``of`` fail (HTTP 500)."""
    k = 0
    for sec in range(seconds):
        recs: list[RequestRecord] = []
        if sec % every_s == 0:
            k += 1
            bad = k % of < failing
            r = record(h.now - 0.5, outcome="error" if bad else "ok",
                       status=500 if bad else 200)
            recs.append(dataclasses.replace(r, id=f"e{k}"))
        if recs:
            h.feed(*recs)
        h.step()


def test_every_request_failing_at_one_every_2_s_raises_errors() -> None:
    h = Harness()
    _run(h, 60, 2, 1, 1)
    assert h.codes() == ["ERRORS"]
    msg = h.updates("ERRORS")[-1].message
    assert msg.startswith("100.0% of the last ") and "(HTTP 500 ×" in msg


def test_a_few_failures_among_many_at_low_traffic_stay_quiet() -> None:
    h = Harness()
    _run(h, 120, 2, 1, 10)  # 1 in 10 fails: 1 failure per 20 s
    assert "ERRORS" not in h.codes()


def test_a_third_failing_at_low_traffic_raises_and_clears_when_they_stop() -> None:
    h = Harness()
    _run(h, 60, 1, 1, 3)  # 1 req/s, a third failing: 7 of 20 in the window
    assert h.codes() == ["ERRORS"]
    _run(h, 60, 2, 0, 1)  # then none fail
    assert h.codes("cleared") == ["ERRORS"]
