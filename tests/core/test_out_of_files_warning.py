"""The OUT_OF_FILES warning's raise/clear logic, on an injected clock and an injected probe
opener (no descriptors used up, no sleeping): raised at the first failure, once; cleared
only after CLEAR_AFTER_S without one; a 502 for want of a descriptor counts as one; the
proxy's processes make one warning. The real processes are in
tests/reliability/test_rel_qa_fds.py."""

from __future__ import annotations

import errno
import io

from prometheus_client import generate_latest

from llmtop.config import load_config
from llmtop.events import WarningEvent, WarningState
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import make_registry
from llmtop.out_of_files import OutOfFilesLog
from llmtop.out_of_files_warning import (
    CLEAR_AFTER_S,
    CODE,
    OWN,
    OutOfFilesSources,
    OutOfFilesWarning,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Opener:
    """The probe's opener: fails with ``error`` (an errno) while it is set."""

    def __init__(self) -> None:
        self.error: int | None = None
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise OSError(self.error, "Too many open files")


def _warning(who: str = "the proxy") -> tuple[OutOfFilesWarning, list[WarningEvent],
                                              Clock, Opener, io.StringIO]:
    clock, opener, out = Clock(), Opener(), io.StringIO()
    log = OutOfFilesLog(out=lambda: out, clock=clock, opener=opener)
    events: list[WarningEvent] = []
    return OutOfFilesWarning(events.append, who, log=log, clock=clock), events, clock, \
        opener, out


def test_raised_at_the_first_failed_probe_and_cleared_only_after_a_quiet_while() -> None:
    warn, events, clock, opener, out = _warning()
    warn.tick()
    assert events == [] and opener.calls == 1  # descriptors free: nothing to say

    opener.error = errno.EMFILE
    warn.tick()
    (raised,) = events
    assert (raised.code, raised.severity, raised.state) == (CODE, "critical", "raised")
    assert raised.message.startswith("the proxy: out of file descriptors (ulimit -n ")
    assert "new client connections are closed unanswered" in raised.message
    assert len(raised.message) < 240, raised.message  # one line of the warnings bar
    assert "llmtop: out of file descriptors" in out.getvalue()  # the output's line stays

    for _ in range(30):  # still short: raised once, not once a tick
        clock.now += 1.0
        warn.tick()
    assert len(events) == 1

    opener.error = None
    clock.now += 1.0
    warn.tick()
    clock.now += CLEAR_AFTER_S - 1.5
    warn.tick()
    assert len(events) == 1, events  # free, but not for long enough yet

    opener.error = errno.EMFILE  # short again for a moment: the quiet while starts over
    clock.now += 1.0
    warn.tick()
    opener.error = None
    clock.now += CLEAR_AFTER_S - 0.5
    warn.tick()
    assert len(events) == 1, events
    clock.now += 0.5
    warn.tick()
    cleared = events[1]
    assert (cleared.code, cleared.state) == (CODE, "cleared"), events
    assert cleared.message.startswith("the proxy: file descriptors free again")

    clock.now += 100.0
    warn.tick()
    assert len(events) == 2  # cleared once
    opener.error = errno.EMFILE
    warn.tick()
    assert [e.state for e in events] == ["raised", "cleared", "raised"]


def test_a_request_refused_for_want_of_a_descriptor_counts_as_short() -> None:
    """The probe can fall between two moments the process is short; a 502 the proxy gave
    for want of an upstream socket (counted by the log anyway) raises it too."""
    warn, events, clock, _, _ = _warning("worker 1")
    warn.log.note_refusal(errno.EMFILE)
    warn.tick()
    assert [(e.code, e.state) for e in events] == [(CODE, "raised")]
    assert events[0].message.startswith("worker 1: out of file descriptors (ulimit -n ")
    clock.now += CLEAR_AFTER_S - 1.0
    warn.log.note_refusal(errno.EMFILE)
    warn.tick()  # the probe succeeds, but a request was refused since the last tick
    clock.now += CLEAR_AFTER_S - 1.0
    warn.tick()
    assert len(events) == 1, events
    clock.now += 1.0
    warn.tick()
    assert [e.state for e in events] == ["raised", "cleared"]


def test_the_system_out_of_descriptors_is_named() -> None:
    warn, events, _, opener, _ = _warning()
    opener.error = errno.ENFILE
    warn.tick()
    assert events[0].message.startswith(
        "the proxy: out of file descriptors (the system's: ENFILE): "), events


def test_another_error_of_the_opener_is_not_out_of_descriptors() -> None:
    warn, events, clock, opener, _ = _warning()
    opener.error = errno.EACCES
    for _ in range(3):
        clock.now += 1.0
        warn.tick()
    assert events == []


def _raise(who: str, state: WarningState = "raised") -> WarningEvent:
    return WarningEvent(1_800_000_000.0, CODE, "critical" if state == "raised" else "info",
                        f"{who}: out of file descriptors (ulimit -n 64): new client "
                        "connections are closed unanswered", state)


def test_the_processes_make_one_warning_cleared_when_none_is_short() -> None:
    """Two workers short, one recovers: still raised (the aggregator keeps one warning per
    code, so passing the clear on would have hidden the other worker)."""
    events: list[WarningEvent] = []
    live = {"a", "b"}
    src = OutOfFilesSources(events.append, live=lambda s: s in live)
    src.saw("b", _raise("worker 1"))
    src.saw("a", _raise("worker 0"))
    assert [e.state for e in events] == ["raised", "raised"]
    assert events[-1].message.startswith("worker 0, worker 1: out of file descriptors")
    src.saw("b", _raise("worker 1", "cleared"))
    assert events[-1].state == "raised", events
    assert events[-1].message.startswith("worker 0: out of file descriptors")
    src.saw(OWN, _raise("the coordinator"))
    assert events[-1].message.startswith("the coordinator, worker 0: ")
    src.saw(OWN, _raise("the coordinator", "cleared"))
    src.saw("a", _raise("worker 0", "cleared"))
    assert [e.state for e in events[-2:]] == ["raised", "cleared"], events
    n = len(events)
    src.saw("a", _raise("worker 0", "cleared"))  # cleared already: nothing more
    assert len(events) == n


def test_a_worker_that_exited_short_no_longer_holds_it_up() -> None:
    events: list[WarningEvent] = []
    live = {"a", "b"}
    src = OutOfFilesSources(events.append, live=lambda s: s in live)
    src.saw("a", _raise("worker 0"))
    src.saw("b", _raise("worker 1"))
    src.prune()
    assert len(events) == 2  # both serve: nothing changes
    live.discard("a")
    src.prune()
    assert events[-1].state == "raised" and events[-1].message.startswith("worker 1: ")
    live.discard("b")
    src.prune()
    assert events[-1].state == "cleared" and events[-1].message.startswith("worker 1: ")
    src.saw(OWN, _raise("the coordinator"))
    src.prune()  # the observers' own process is always there
    assert events[-1].state == "raised"


def test_the_warning_reaches_the_snapshot_and_metrics() -> None:
    agg = Aggregator(load_config(None, env={}), {})
    warn, _events, clock, opener, _ = _warning()
    src = OutOfFilesSources(lambda ev: agg.on_events([ev]))
    warn.publish = lambda ev: src.saw(OWN, ev)
    opener.error = errno.EMFILE
    warn.tick()
    (shown,) = agg.snapshot(10)["warnings"]
    assert (shown["code"], shown["severity"]) == (CODE, "critical"), shown
    assert shown["message"].startswith("the proxy: out of file descriptors")
    text = generate_latest(make_registry(agg)).decode()
    assert f'llmtop_warning_active{{code="{CODE}"}} 1.0' in text
    opener.error = None
    clock.now += CLEAR_AFTER_S
    warn.tick()
    assert agg.snapshot(10)["warnings"] == []
    text = generate_latest(make_registry(agg)).decode()
    assert f'llmtop_warning_active{{code="{CODE}"}} 0.0' in text
