"""ERRORS, once raised, holds while the error rate stays at half its threshold or more —
whatever the request rate. The evidence a raise needs (20 requests and 3 failures in the
2 W window, and the Wilson bound) also had to hold for it to stay raised, so a steady 20 %
error rate whose traffic dipped below 20 requests per 20 s cleared the warning and raised
it again with the next busy stretch: with traffic alternating between 1.5 and 0.8 req/s
every 30 s, one raise and one clear a minute."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, record

from llmtop.events import RequestRecord


def _traffic(h: Harness, seconds: int) -> None:
    """Every fifth request fails (HTTP 500); 1.5 req/s for 30 s, then 0.8 req/s for 30 s,
    and so on (three then two requests every two seconds, and 4 in 5 seconds)."""
    k = 0
    for sec in range(seconds):
        busy = (sec // 30) % 2 == 0
        n = (2 if sec % 2 else 1) if busy else (1 if sec % 5 in (0, 1, 2, 3) else 0)
        recs: list[RequestRecord] = []
        for i in range(n):
            k += 1
            bad = k % 5 == 0
            r = record(h.now - 0.5 + 0.1 * i, outcome="error" if bad else "ok",
                       status=500 if bad else 200)
            recs.append(dataclasses.replace(r, id=f"e{k}"))
        h.feed(*recs)
        h.step()


def test_a_steady_error_rate_at_a_varying_request_rate_stays_raised() -> None:
    h = Harness()
    _traffic(h, 600)
    assert h.codes().count("ERRORS") == 1, [
        (round(e.t - h.now), e.state) for e in h.events if getattr(e, "code", "") == "ERRORS"]
    assert h.codes("cleared").count("ERRORS") == 0
    assert "ERRORS" in h.mon.raised()


def test_it_still_clears_when_the_errors_stop() -> None:
    h = Harness()
    _traffic(h, 120)
    assert "ERRORS" in h.mon.raised()
    for _ in range(60):  # 0.8 req/s, none failing
        h.feed(dataclasses.replace(record(h.now - 0.5), id=f"ok{h.now}"))
        h.step()
    assert "ERRORS" not in h.mon.raised()
    assert h.codes("cleared").count("ERRORS") == 1
