"""The ``OUT_OF_FILES`` warning: a process of the proxy has run out of file descriptors.

:mod:`llmtop.out_of_files` says so in one line on the process's output, which is all a
headless user needs; but under the TUI (``llmtop run``: the proxy is a child whose output
is not on screen), through ``llmtop attach``, the admin API or ``/metrics``, nothing said
that clients were being closed unanswered. This warning says it where those look: the
snapshot's ``warnings``, the recording's ``warning`` lines, ``llmtop_warning_active``.

Two parts:

- :class:`OutOfFilesWarning`, one per process that serves clients (the single process, each
  ``--workers`` worker, the coordinator for its admin API), runs the descriptor probe on a
  tick that runs anyway (the observers' once-a-second tick, a worker's event forwarding:
  nothing per chunk or per request) and turns its answers into raised/cleared events;
- :class:`OutOfFilesSources`, on the observers' side, makes the one ``OUT_OF_FILES`` of
  the proxy out of those of its processes: raised while any is short, cleared when none
  is (the aggregator keeps one warning per code: a worker's clear must not hide another
  that is still short), and a worker that exited is short no more.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import Final

from llmtop.clock import unix_now
from llmtop.events import WarningEvent
from llmtop.out_of_files import OutOfFilesLog, open_files_limit, out_of_files

CODE: Final = "OUT_OF_FILES"

CLEAR_AFTER_S: Final = 10.0
"""Cleared once neither the probe nor a request has found the process short of descriptors
for this long. Each probe is an exact answer, not an estimate (the detectors wait 15 s
for noisy figures to settle), but under a surge the process is short by moments: streams
end, their descriptors are taken again at once, and a probe in between succeeds. Ten
seconds is ten probes (twenty in a worker) without a failure — long enough not to clear
and raise again with every stream that ends, short enough that the screens stop warning
soon after the surge."""

OWN: Final = ""
""":class:`OutOfFilesSources`' key for the observers' own process (always there)."""


class OutOfFilesWarning:
    """Raises ``OUT_OF_FILES`` for one process (``who``: ``the proxy``, ``worker 1``) the
    first time :meth:`tick` finds it short, clears it after :data:`CLEAR_AFTER_S` without.

    Short is the probe failing (no descriptor to accept a client with: clients closed
    unseen) or a request answered 502 for want of an upstream socket since the last tick
    (the log's ``refused`` count, which the proxy keeps anyway: nothing added to the
    request path). ``clock`` is monotonic; the events carry unix time."""

    def __init__(self, publish: Callable[[WarningEvent], None], who: str, *,
                 log: OutOfFilesLog = out_of_files,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.who = who
        self.log = log
        self.clock = clock
        self.raised = False
        self.short_at = 0.0
        """When the process was last found short (``clock``)."""
        self._refused = log.refused

    def tick(self) -> None:
        """Probe once; publish a raise or a clear when the state changes."""
        ok = self.log.probe()
        refused = self.log.refused
        if refused != self._refused:  # a 502 for want of a descriptor since the last tick
            ok, self._refused = False, refused
        now = self.clock()
        if not ok:
            self.short_at = now
            if not self.raised:
                self.raised = True
                self.publish(WarningEvent(unix_now(), CODE, "critical", self.message(),
                                          "raised"))
        elif self.raised and now - self.short_at >= CLEAR_AFTER_S:
            self.raised = False
            self.publish(WarningEvent(
                unix_now(), CODE, "info",
                f"{self.who}: file descriptors free again (none short for "
                f"{CLEAR_AFTER_S:g} s)", "cleared"))

    def message(self) -> str:
        """What the output's line says, shorter (the TUI gives a warning one line): who,
        the limit, what it does to clients, the remedy."""
        whose = ("the system's: ENFILE" if self.log.errno == errno.ENFILE
                 else open_files_limit())
        return (f"{self.who}: out of file descriptors ({whose}): new client connections "
                "are closed unanswered, requests finding no socket to the upstream get "
                "502; raise the limit (ulimit -n, LimitNOFILE=) or send fewer streams")


class OutOfFilesSources:
    """The proxy's one ``OUT_OF_FILES``, from its processes' (module docstring).

    :meth:`saw` takes one process's event (``source``: :data:`OWN`, or a worker process's
    sender id); ``live(source)`` says whether a worker process still serves (a raise from
    one that exited would otherwise stay up for good); :meth:`prune`, on the observers'
    tick, forgets those that do not. Raised, the message names every process short now
    (``worker 0, worker 1: out of file descriptors …``); a raise with other names keeps the
    warning's "since" (the aggregator keeps the first raise's time)."""

    def __init__(self, publish: Callable[[WarningEvent], None],
                 live: Callable[[str], bool] = lambda source: True) -> None:
        self.publish = publish
        self.live = live
        self.short: dict[str, str] = {}
        """Source → its raise's message, for the processes short now."""

    def saw(self, source: str, ev: WarningEvent) -> None:
        if ev.state == "raised":
            self.short[source] = ev.message
            self._raise(ev.t)
        elif self.short.pop(source, None) is not None:
            if self.short:
                self._raise(ev.t)
            else:
                self.publish(ev)

    def prune(self) -> None:
        gone = [s for s in self.short if s != OWN and not self.live(s)]
        if not gone:
            return
        names = ", ".join(_who(self.short.pop(s)) for s in gone)
        if self.short:
            self._raise(unix_now())
        else:
            self.publish(WarningEvent(unix_now(), CODE, "info",
                                      f"{names}: exited while out of file descriptors",
                                      "cleared"))

    def _raise(self, t: float) -> None:
        messages = sorted(self.short.values())  # by name: worker 0, worker 1
        names = ", ".join(_who(m) for m in messages)
        what = messages[-1].partition(": ")[2]
        self.publish(WarningEvent(t, CODE, "critical", f"{names}: {what}", "raised"))


def _who(message: str) -> str:
    """``worker 1`` of ``worker 1: out of file descriptors …``."""
    return message.partition(": ")[0]
