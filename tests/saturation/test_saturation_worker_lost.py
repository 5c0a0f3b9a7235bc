"""Requests lost with a `--workers` worker that died (their records made by the
coordinator: open in its last report, or opened after it) are WORKER_DOWN's, not ERRORS':
ERRORS tells the user to read the engine's log, and the engine did nothing wrong. Without
the 20-request floor (0139537), a worker killed with 6 requests held among 17 good ones
raised ERRORS beside WORKER_DOWN (tests/scale/test_workers.py saw it 3 times in 15)."""

from __future__ import annotations

import dataclasses

from test_saturation_unit import Harness, record

from llmtop.events import ActiveRequest, RequestRecord
from llmtop.worker_procs import unreported_lost


def _open_at_death(h: Harness, k: int) -> RequestRecord:
    """What the coordinator publishes for a request its dead worker's last report had open
    (``ActiveRequest.lost``, with the supervisor's error line)."""
    t0 = h.now - 2.0
    a = ActiveRequest(id=f"held{k}", user="u", model="m", dialect="openai",
                      path="/v1/chat/completions", stream=True, t_start=t0,
                      t0_ns=int(t0 * 1e9))
    return a.lost(int(h.now * 1e9), "llmtop worker 1 exited (killed by SIGKILL) with the "
                  "request open")


def _good(h: Harness, k: int) -> RequestRecord:
    return dataclasses.replace(record(h.now - 0.5), id=f"ok{k}")


def test_requests_lost_with_a_dead_worker_do_not_raise_errors() -> None:
    h = Harness()
    for k in range(17):
        h.feed(_good(h, k))
        h.step()
    h.feed(*[_open_at_death(h, k) for k in range(4)],
           *[unreported_lost(1, 4242, k, "killed by SIGKILL", ended=k % 2 == 0)
             for k in range(3)])
    for _ in range(30):
        h.feed(_good(h, 100 + _))
        h.step()
    assert "ERRORS" not in h.codes()


def test_the_engines_own_errors_beside_them_still_do() -> None:
    h = Harness()
    for k in range(17):
        h.feed(_good(h, k))
        h.step()
    h.feed(*[_open_at_death(h, k) for k in range(4)])
    for k in range(6):
        bad = dataclasses.replace(record(h.now - 0.5, outcome="error", status=500),
                                  id=f"bad{k}")
        h.feed(bad, _good(h, 200 + k))
        h.step()
    assert h.codes() == ["ERRORS"]
    msg = h.updates("ERRORS")[-1].message
    assert "HTTP 500 ×" in msg and "502" not in msg  # (the lost ones are not named)
