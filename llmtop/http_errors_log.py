"""One line, not a traceback, for a malformed request that aiohttp's parser refuses.

A request line over 8 KiB, an unknown method or a broken chunked body is answered 400 by
aiohttp before llmtop's handlers see it, and aiohttp logs most of them with a full
traceback (``aiohttp.server``, "Error handling request"). Any local client (the admin
API) or any client of the proxy could then fill the proxy's output with tracebacks.
Such parse errors become one line, at most one every ``every_s`` seconds (with a count of
the others); the bytes the client sent are never repeated (they may be a prompt).
Anything else logged there — an exception in a handler of ours — keeps its traceback:
that is a bug to report.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from aiohttp.http_exceptions import HttpProcessingError

LOGGER = "aiohttp.server"


class ParseErrorLine(logging.Handler):
    """The handler :func:`install` puts on ``aiohttp.server``."""

    def __init__(self, out: TextIO | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logging.WARNING)
        self.out = out
        self.every_s = every_s
        self.clock = clock
        self._next = 0.0
        self._held = 0
        self._full = logging.StreamHandler()

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        out = self.out if self.out is not None else sys.stderr
        if not isinstance(exc, HttpProcessingError):
            self._full.setStream(out)
            self._full.handle(record)  # ours: the traceback is wanted
            return
        now = self.clock()
        if now < self._next:
            self._held += 1
            return
        more = f"; {self._held} more since" if self._held else ""
        self._held = 0
        self._next = now + self.every_s
        where = record.getMessage().removeprefix("Error handling request").strip()
        try:
            out.write(f"llmtop: refused a malformed HTTP request {where} "
                      f"({type(exc).__name__}, answered {exc.code}){more}\n".replace("  ", " "))
            out.flush()
        except (OSError, ValueError):  # output closed: nothing to tell
            pass


def install(out: TextIO | None = None) -> ParseErrorLine:
    """Put :class:`ParseErrorLine` on ``aiohttp.server`` (once per process)."""
    log = logging.getLogger(LOGGER)
    for h in list(log.handlers):
        if isinstance(h, ParseErrorLine):
            log.removeHandler(h)
    handler = ParseErrorLine(out)
    log.addHandler(handler)
    log.propagate = False
    return handler
