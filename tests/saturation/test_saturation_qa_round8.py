"""QA round 8: the QUEUEING message mixed the proxy's in-flight count with the ENGINE's
queue — "saturated: 1 in flight, 4 of them only waiting" when the engine was also serving
another proxy's traffic. Each figure now says whose it is, and "of them" never counts more
than are in flight."""

from __future__ import annotations

import re
from collections.abc import Callable

from test_saturation_unit import Harness, healthy_traffic, record

from llmtop.events import ActiveRequest, EngineReading

OF_THEM = re.compile(r"(\d+) in flight, (\d+) of them")


def _queueing(h: Harness, setup: Callable[[], None]) -> str:
    healthy_traffic(h, 30)
    for _ in range(20):
        setup()
        h.feed(*[record(h.now - 2.0, ttft=1.2) for _ in range(3)])
        h.step()
        if "QUEUEING" in h.mon.raised():
            return h.mon.raised()["QUEUEING"]
    raise AssertionError(f"QUEUEING never raised: {h.codes()}")


def test_engine_queue_of_other_clients_is_named_as_the_engines() -> None:
    h = Harness()

    def one_here_four_at_the_engine() -> None:
        h.set_waiting(1, age_s=1.5)  # this proxy: one request, no first token yet
        h.feed(EngineReading(t=h.now, kind="vllm", running=8, waiting=4))

    msg = _queueing(h, one_here_four_at_the_engine)
    assert "engine queue 4" in msg, msg
    assert "through this proxy 1 in flight" in msg, msg
    m = OF_THEM.search(msg)
    assert m is not None and int(m[2]) <= int(m[1]), msg
    assert "4 of them" not in msg and "only waiting" not in msg, msg


def test_without_engine_metrics_the_queue_is_the_proxys_own() -> None:
    h = Harness()

    def three_here_two_waiting() -> None:
        h.set_waiting(3, age_s=1.5)
        # one of the three already streams
        a = h.active["w0"]
        h.active["w0"] = ActiveRequest(
            id=a.id, user=a.user, model=a.model, dialect=a.dialect, path=a.path,
            stream=True, t_start=a.t_start, t0_ns=a.t0_ns, first_token_ns=a.t0_ns + 10)

    msg = _queueing(h, three_here_two_waiting)
    assert "engine" not in msg, msg
    assert "3 in flight, 2 of them without a first token" in msg, msg
