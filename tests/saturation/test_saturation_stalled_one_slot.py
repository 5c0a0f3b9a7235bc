"""UPSTREAM_STALLED beside a non-streamed answer: an engine serving one request at a time
(llama.cpp with one slot, Ollama) is silent while it generates a non-streamed answer,
whose bytes come only at its end, and a streamed request queued behind it waits. That was
"engine stalled … is it hung?", critical; it is now a warning that names the non-streamed
request. With no such request in flight all the silent time it stays critical."""

from __future__ import annotations

import re

from test_saturation_stalled import _harness, _waiting
from test_saturation_unit import healthy_traffic

from llmtop.events import WarningEvent


def _stalled(events: list[object]) -> list[WarningEvent]:
    return [e for e in events if isinstance(e, WarningEvent) and e.code == "UPSTREAM_STALLED"
            and e.state == "raised"]


def test_a_one_slot_engine_busy_with_a_whole_answer_is_a_warning_not_critical() -> None:
    h = _harness(5.0)
    healthy_traffic(h, 10)
    _waiting(h, "whole", 3.0, stream=False)  # generating, all the silence long
    for _ in range(12):
        _waiting(h, "s", 9.0)  # queued behind it
        h.step()
    raised = _stalled(h.events)
    assert raised, h.mon.raised()
    last = raised[-1]
    assert last.severity == "warning"
    assert last.message.startswith("engine silent: 1 streamed request waiting for a first "
                                   "token"), last.message
    assert re.search(r"while 1 non-streamed request is in flight \(the oldest \d+ s\), "
                     r"whose answer shows only when it ends", last.message), last.message
    assert "one request at a time" in last.message


def test_without_a_whole_answer_in_flight_all_along_it_stays_critical() -> None:
    """A non-streamed request that came after the silence began does not explain it."""
    h = _harness(5.0)
    healthy_traffic(h, 10)
    for _ in range(12):
        _waiting(h, "s", 9.0)
        _waiting(h, "late", 1.0, stream=False)  # keeps arriving fresh: 1 s old
        h.step()
    raised = _stalled(h.events)
    assert raised and raised[-1].severity == "critical"
    assert raised[-1].message.startswith("engine stalled:"), raised[-1].message
