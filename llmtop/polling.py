"""A polling loop with back-off, shared by the samplers that read other servers over HTTP
(the engine's ``/metrics`` scraper, the simulator's ``/sim/gpu`` source)."""

from __future__ import annotations

import asyncio
import ssl
from abc import ABC, abstractmethod
from typing import Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from llmtop.ticks import grid_delay

T = TypeVar("T")


def shown_url(url: str) -> str:
    """``url`` as a status line writes it: a password (``engine.metrics_url =
    "http://user:password@gateway/metrics"``, which aiohttp sends as basic auth) as
    ``***`` (``gpu.sim_url`` likewise). The status lines reach the screens and the admin
    API's snapshot, which ``llmtop attach`` reads from other machines; they wrote the URL as
    given."""
    u = urlsplit(url)
    if u.password is None:
        return url
    host = u.netloc.rpartition("@")[2]
    return urlunsplit((u.scheme, f"{u.username or ''}:***@{host}", u.path, u.query,
                       u.fragment))


class Poller(ABC, Generic[T]):
    """Calls :meth:`once` every ``interval_s``; after ``n`` consecutive failures it waits
    ``interval_s × 2ⁿ`` (at most ``max_backoff_s``). ``status`` is one line for the UI.

    Subclasses implement ``once(session)`` (raise on failure), ``describe(result)`` and
    ``explain(exc)``. ``session=None``: :meth:`run` opens its own ``ClientSession`` and
    closes it when cancelled.
    """

    def __init__(self, url: str, session: aiohttp.ClientSession | None, *, interval_s: float,
                 max_backoff_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.url = url
        self.shown = shown_url(url)
        """``url`` as the status lines write it (a password as ``***``)."""
        self._session = session
        self._interval_s = interval_s
        self._max_backoff_s = max(max_backoff_s, interval_s)
        self.failures = 0
        """Consecutive failed polls (0 after a success)."""
        self.status = ""
        self.ssl: ssl.SSLContext | None = None
        """TLS for the session :meth:`run` opens (None: aiohttp's default)."""

    @abstractmethod
    async def once(self, session: aiohttp.ClientSession) -> T:
        """One poll: publish and return what was read; raise when it failed."""

    @abstractmethod
    def describe(self, result: T) -> str:
        """The status line after a successful poll."""

    def explain(self, exc: Exception) -> str:
        return f"{self.url}: {type(exc).__name__}: {exc}"

    def _delay(self, now: float) -> float:
        """The wait before the next poll: to the next multiple of the interval on the
        loop's clock (``now``) — the loop's other periodic tasks wake at the same instants
        (:mod:`llmtop.ticks`) — or the back-off after failures."""
        if not self.failures:
            return grid_delay(now, self._interval_s)
        return min(self._interval_s * 2.0 ** min(self.failures, 16), self._max_backoff_s)

    async def run(self) -> None:
        """Poll until cancelled. Never raises anything but CancelledError."""
        own = self._session is None
        session = (aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl))
                   if own and self.ssl is not None
                   else aiohttp.ClientSession() if own else self._session)
        assert session is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    result = await self.once(session)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # anything: report it and keep going
                    self.failures += 1
                    self.status = self.explain(exc)
                else:
                    self.failures = 0
                    self.status = self.describe(result)
                await asyncio.sleep(self._delay(loop.time()))
        finally:
            if own:
                await session.close()
