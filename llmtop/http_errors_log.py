"""One line, not a traceback, for a malformed request that aiohttp's parser refuses.

A request line or header over 8 KiB, a bad chunked body or a bad ``Content-Length`` is
answered 400 by aiohttp before llmtop's handlers see it, and aiohttp logs each with a full
traceback (``aiohttp.server``, "Error handling request from HOST"). Any client of the
proxy, or any local client of the admin API, could then fill the proxy's output. The
filter :func:`install` puts on that logger turns such a record into one warning line —
at most one every :data:`BAD_REQUEST_LOG_S` seconds for the whole process, with a count of
the others — that names the peer and the kind of fault, never the bytes the client sent
(they may be a prompt). Anything else logged there (an exception in a handler of ours)
keeps its traceback: that is a bug to report. Both servers install it when they start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from aiohttp.http_exceptions import HttpProcessingError

LOGGER: Final = "aiohttp.server"
BAD_REQUEST_LOG_S: Final = 60.0
"""At most one line per this many seconds about clients' malformed requests."""


class BadRequests:
    """When the last line was written and how many malformed requests went unsaid since
    (one per process: the proxy and the admin API share it)."""

    logged_at = -BAD_REQUEST_LOG_S
    unlogged = 0


bad_requests = BadRequests()


class OneLine(logging.Filter):
    """The filter :func:`install` puts on :data:`LOGGER`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno < logging.ERROR or not isinstance(exc, HttpProcessingError):
            return True  # aiohttp's debug lines, and our own bugs with their tracebacks
        now = self.clock()
        if now - bad_requests.logged_at < BAD_REQUEST_LOG_S:
            bad_requests.unlogged += 1
            return False
        more = bad_requests.unlogged
        bad_requests.logged_at, bad_requests.unlogged = now, 0
        args = record.args if isinstance(record.args, tuple) else ()
        peer = args[0] if args and args[0] else "a client"
        record.msg = "llmtop: malformed request from %s answered %s (%s)%s"
        record.args = (peer, exc.code, type(exc).__name__,
                       f"; {more} more since the last such line" if more else "")
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install() -> OneLine:
    """Put :class:`OneLine` on :data:`LOGGER`, once per process; returns it."""
    log = logging.getLogger(LOGGER)
    for f in log.filters:
        if isinstance(f, OneLine):
            return f
    one = OneLine()
    log.addFilter(one)
    return one
