"""Saying so when the process has run out of file descriptors (``EMFILE``/``ENFILE``).

A surge of clients, or a host whose ``ulimit -n`` is low, uses up the descriptors. Two
things then fail, and before this module neither said why:

- accepting a client: uvloop (libuv's reserve-descriptor trick) accepts and closes the
  connection at once, before any Python code sees it — the client sees its connection
  drop, the proxy said nothing. :func:`probe` (called from a periodic tick that runs
  anyway: the observers' metrics tick, a worker's event forwarding) finds the process
  without a free descriptor and says so;
- opening the socket to the upstream for a client that was accepted: the proxy answers
  502 with :func:`refusal`'s message — llmtop's own limit, not the engine's (it read
  "upstream unreachable", raised UPSTREAM_DOWN and sent users to an engine that was fine)
  — and calls :func:`note_refusal`.

Either says one line — at most one every :data:`SAY_EVERY_S` seconds for the whole
process, with a count of the requests refused since the last — not one per request, and
no traceback. That line is for headless users (it goes to the process's stderr, which the
TUI's proxy child does not show): the screens, the admin API and /metrics learn of it from
the ``OUT_OF_FILES`` warning (:mod:`llmtop.out_of_files_warning`), raised by the same
probe.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

from llmtop.events import OUT_OF_FILES_PREFIX

OUT_OF_FILES_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})

SAY_EVERY_S: Final = 60.0
"""At most one line per this many seconds about running out of descriptors."""


def is_out_of_files(exc: BaseException | None) -> bool:
    """``exc`` is the process (EMFILE) or the system (ENFILE) out of file descriptors."""
    return isinstance(exc, OSError) and exc.errno in OUT_OF_FILES_ERRNOS


def open_files_limit() -> str:
    """``ulimit -n N`` (the soft limit now), for messages."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on Linux/macOS
        return "ulimit -n"
    return "no ulimit -n" if soft == resource.RLIM_INFINITY else f"ulimit -n {soft}"


def refusal() -> str:
    """The error message for the client (after ``llmtop: ``: ``llmtop: out of file
    descriptors (ulimit -n N): …``) and the request's record."""
    return (f"{OUT_OF_FILES_PREFIX} ({open_files_limit()}): cannot open a connection to "
            "the upstream; retry later")


def open_one() -> None:
    """Open and close one descriptor (``/dev/null``): the probe's test."""
    os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))


class OutOfFilesLog:
    """When the last line was said and how many refusals went unsaid since (one per
    process, :data:`out_of_files`: the proxy and the observers' probe share it).
    ``opener``: what the probe tries (tests pass one that fails)."""

    def __init__(self, out: Callable[[], TextIO] = lambda: sys.stderr,
                 clock: Callable[[], float] = time.monotonic,
                 opener: Callable[[], None] = open_one) -> None:
        self.out = out
        self.clock = clock
        self.opener = opener
        self.errno: int | None = None
        """The last failure's ``EMFILE`` or ``ENFILE`` (None before any)."""
        self.said_at = -SAY_EVERY_S
        self.unsaid = 0
        self.refused = 0
        """Requests answered 502 for want of a descriptor, in all."""

    def note_refusal(self, code: int | None = None) -> None:
        """One request answered 502: its upstream socket could not be opened."""
        self.refused += 1
        self.errno = code if code in OUT_OF_FILES_ERRNOS else self.errno
        self._say(code, refused=True)

    def probe(self) -> bool:
        """Whether a descriptor can be had now (one open and close of ``/dev/null``, a few
        µs); says so when none can."""
        try:
            self.opener()
        except OSError as exc:
            if exc.errno in OUT_OF_FILES_ERRNOS:
                self.errno = exc.errno
                self._say(exc.errno, refused=False)
                return False
        return True

    def _say(self, code: int | None, *, refused: bool) -> None:
        now = self.clock()
        if now - self.said_at < SAY_EVERY_S:
            self.unsaid += refused
            return
        more, self.said_at, self.unsaid = self.unsaid, now, 0
        who = ("the system (ENFILE)" if code == errno.ENFILE
               else f"this process ({open_files_limit()})")
        line = (f"llmtop: out of file descriptors: {who} has none free: new client "
                "connections are closed unanswered, and requests that find no free socket "
                "to the upstream are answered 502, until some close"
                + (f" ({more} more refused since the last such line)" if more else "")
                + "; raise the limit (ulimit -n; systemd LimitNOFILE=) or send fewer "
                "streams at once")
        try:
            print(line, file=self.out(), flush=True)
        except (OSError, ValueError):  # the output is gone: nobody to tell
            pass


out_of_files = OutOfFilesLog()
"""The process's one log (see :class:`OutOfFilesLog`)."""
