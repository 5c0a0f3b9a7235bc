"""Scraping the upstream engine's Prometheus ``/metrics`` on an interval.

:class:`EngineScraper` GETs the URL every ``interval_s``, parses the text in a worker
thread (a large vLLM exposition takes milliseconds of pure Python that must not stall the
proxy's event loop), publishes one :class:`~llmtop.events.EngineReading` per scrape and
keeps it as :attr:`EngineScraper.latest`. A 404, a refused connection or text that is not
exposition format becomes :attr:`EngineScraper.status` (another error status with the
engine's own message, when its body gives one) and a back-off (doubling up to
``max_backoff_s``); the loop only ends when cancelled. An exposition so big that parsing
it takes more than :data:`PARSE_SHARE` of the interval's CPU time is scraped less often
(every parse time ÷ ``PARSE_SHARE``, on the interval's grid), and the status says so: the
parse holds the interpreter the proxy forwards tokens with (16 MB of vLLM text takes
~0.5 s of CPU). An engine without ``/metrics``
(Ollama) is therefore harmless: the status says so and the rest of llmtop carries on.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp

from llmtop.clock import unix_now
from llmtop.config import Config, socket_netloc
from llmtop.engines.recognise import recognise
from llmtop.events import EngineReading, Event
from llmtop.out_of_files import is_out_of_files, open_files_limit
from llmtop.polling import Poller

MAX_BYTES = 16 * 1024 * 1024
"""Largest exposition accepted (vLLM with many models/ranks stays far below)."""
INLINE_PARSE_CHARS = 32 * 1024
"""An exposition up to this long is parsed on the loop, a longer one in a thread."""
PARSE_SHARE = 0.05
"""The most of one core's time parsing scrapes may take, on average; a slower parse
spaces the scrapes out."""
REASON_BYTES = 4096
"""Of an error answer to the scrape, the bytes read for its message."""
REASON_CHARS = 200
"""The longest engine message a failed scrape's status line quotes."""


CURRENT_MIN_S = 5.0
"""A reading is current for at least this long past the scrapes due after it
(:func:`current_for_s`)."""


def scrape_timeout_s(interval_s: float) -> float:
    """The longest one scrape may take: 5 intervals, within 2..10 s."""
    return max(2.0, min(10.0, 5 * interval_s))


def current_for_s(interval_s: float, gap_s: float = 0.0) -> float:
    """How long after it was taken a reading still stands for the engine's state: three
    scrapes' spacing (the interval, or ``gap_s``, the time between the last two readings:
    a big exposition is scraped less often), at least :data:`CURRENT_MIN_S`, plus the
    longest a scrape may take. Past that, the scrapes have been failing (or stuck): the
    reading is the engine's past, not its state (``/metrics`` leaves it out)."""
    return max(CURRENT_MIN_S, 3 * max(interval_s, gap_s)) + scrape_timeout_s(interval_s)


class ScrapeError(Exception):
    """One failed scrape; the message is the status line to show."""


def metrics_url_for(upstream: str, configured: str = "") -> str:
    """``configured`` if set; else ``/metrics`` under the engine's root: the upstream's
    origin plus its path prefix less a trailing ``/v1`` (the OpenAI API's own prefix).

    The proxy forwards a client's ``/v1/chat/completions`` to ``upstream path +
    /v1/chat/completions``, so a prefix such as ``http://gw/llama`` (a gateway route, or
    llama-server's ``--api-prefix``) is where the engine's root is, and its ``/metrics`` is
    ``http://gw/llama/metrics``, not the gateway's own ``http://gw/metrics``;
    ``http://h:8000/v1`` and ``http://gw/llama/v1`` give ``http://h:8000/metrics`` and
    ``http://gw/llama/metrics``. "" when there is neither (nothing to scrape)."""
    if configured:
        return configured
    u = urlsplit(upstream)
    if not u.scheme or not u.netloc:
        return ""
    root = u.path.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return f"{u.scheme}://{socket_netloc(u.netloc)}{root}/metrics"


class EngineScraper(Poller[EngineReading]):
    """Polls ``url`` every ``interval_s`` seconds. ``session=None``: :meth:`run` opens its
    own ``aiohttp.ClientSession`` and closes it when cancelled."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession | None,
        publish: Callable[[Event], None],
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = unix_now,
        max_backoff_s: float = 30.0,
        parse_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        super().__init__(url, session, interval_s=interval_s, max_backoff_s=max_backoff_s)
        self._publish = publish
        self._clock = clock
        self._parse_clock = parse_clock
        self.parse_s = 0.0
        """CPU seconds the last successful scrape's parse took (``parse_clock``: the
        parsing thread's CPU time, so waiting for the interpreter lock does not count)."""
        self.parse_chars = 0
        """How long the last successful scrape's text was."""
        self.latest: EngineReading | None = None
        """The last successful scrape."""
        self.status = f"engine metrics: waiting for {self.shown}"
        """One line for the UI: "vllm engine at URL" or why the last scrape failed."""
        self.scrapes = 0
        """Successful scrapes."""

    async def scrape_once(self, session: aiohttp.ClientSession) -> EngineReading:
        """One GET + parse; publishes and returns the reading. Raises :class:`ScrapeError`."""
        timeout = aiohttp.ClientTimeout(total=scrape_timeout_s(self._interval_s))
        t = self._clock()
        try:
            async with session.get(self.url, timeout=timeout) as resp:
                if resp.status == 404:
                    raise ScrapeError(f"no /metrics at {self.shown} (HTTP 404)")
                if resp.status in (401, 403) and self.shown != self.url:
                    raise ScrapeError(f"{self.shown}: HTTP {resp.status} (the credentials "
                                      "in engine.metrics_url were refused)")
                if resp.status in (401, 403):
                    # llmtop sends no credentials here (vLLM's --api-key guards /v1 only;
                    # a gateway may guard /metrics too): say where the fix is
                    raise ScrapeError(
                        f"{self.shown}: HTTP {resp.status} (it wants credentials, which "
                        "llmtop does not send: point engine.metrics_url at the engine's "
                        "own /metrics, or set engine.enabled = false)")
                if resp.status != 200:
                    # the engine's own reason, when it gives one: llama.cpp without
                    # --metrics answers 501 "... Start it with `--metrics`"
                    why = _reason(await resp.content.read(REASON_BYTES))
                    raise ScrapeError(f"{self.shown}: HTTP {resp.status}"
                                      + (f" ({why})" if why else ""))
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > MAX_BYTES:
                        raise ScrapeError(
                            f"{self.shown}: exposition larger than {MAX_BYTES} bytes")
                    chunks.append(chunk)
        except aiohttp.ClientError as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) and is_out_of_files(exc.os_error):
                # llmtop's own limit: nothing is wrong with the engine's /metrics
                raise ScrapeError(f"{self.shown} not scraped: llmtop is out of file "
                                  f"descriptors ({open_files_limit()})") from None
            raise ScrapeError(f"no /metrics at {self.shown} ({_why(exc)})") from None
        except TimeoutError:
            raise ScrapeError(f"no /metrics at {self.shown} (timed out)") from None
        text = b"".join(chunks).decode("utf-8-sig", errors="replace")  # a BOM is not text
        try:
            # a small exposition is parsed here (~50 µs per KiB); handing it to a thread
            # and back costs two more thread wake-ups than that, every scrape (the
            # simulator's and llama.cpp's are 2-7 KiB); a big one (vLLM with many
            # histogram buckets) goes to a thread, so the admin API is not held up by it
            reading, cpu_s = (self._parse(text, t) if len(text) <= INLINE_PARSE_CHARS
                              else await asyncio.to_thread(self._parse, text, t))
        except ValueError as exc:
            raise ScrapeError(f"{self.shown} is not Prometheus text ({exc})") from None
        self.parse_s, self.parse_chars = cpu_s, len(text)
        self._publish(reading)
        self.latest = reading
        self.scrapes += 1
        return reading

    def _parse(self, text: str, t: float) -> tuple[EngineReading, float]:
        """The reading, and the CPU seconds parsing it took (in the thread it ran in)."""
        start = self._parse_clock()
        reading = recognise(text, t)
        return reading, max(0.0, self._parse_clock() - start)

    async def once(self, session: aiohttp.ClientSession) -> EngineReading:
        return await self.scrape_once(session)

    @property
    def spacing_s(self) -> float:
        """The least time between scrapes that keeps parsing within :data:`PARSE_SHARE` of
        a core: the interval, or more for an exposition that is slow to parse."""
        return max(self._interval_s, self.parse_s / PARSE_SHARE)

    def _delay(self, now: float) -> float:
        base = super()._delay(now)
        spacing = self.spacing_s
        if self.failures or spacing <= self._interval_s or spacing <= base:
            return base
        # still on the interval's grid, as the loop's other periodic tasks are
        return base + math.ceil((spacing - base) / self._interval_s - 1e-9) * self._interval_s

    def describe(self, result: EngineReading) -> str:
        said = _describe(result, self.shown)
        if self.spacing_s > self._interval_s:
            said += (f"; scraped every {self.spacing_s:.0f} s, not "
                     f"{self._interval_s:g} s: parsing its "
                     f"{self.parse_chars / 1e6:.1f} MB exposition takes "
                     f"{self.parse_s * 1000:.0f} ms of CPU")
        return said

    def explain(self, exc: Exception) -> str:
        if isinstance(exc, ScrapeError):
            return str(exc)
        return f"{self.shown}: {type(exc).__name__}: {exc}".replace(self.url, self.shown)


def _reason(body: bytes) -> str:
    """The message of an error answer's body, on one line and at most
    :data:`REASON_CHARS` long: ``error.message`` (llama.cpp, vLLM), a string ``error``,
    ``message`` or ``detail``, else the body's text when it is short plain text (not HTML);
    "" when there is none."""
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return ""
    said: object = None
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            err = obj.get("error")
            if isinstance(err, dict):
                err = err.get("message")
            for said in (err, obj.get("message"), obj.get("detail")):
                if isinstance(said, str) and said.strip():
                    break
            else:
                return ""
    elif not text.startswith("<") and len(body) < REASON_BYTES:
        said = text
    if not isinstance(said, str):
        return ""
    line = " ".join(said.split())
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


def _why(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    return str(exc) or type(exc).__name__


def _describe(r: EngineReading, url: str) -> str:
    if r.kind == "unknown":
        return f"unknown engine at {url} ({len(r.raw)} raw values kept)"
    return f"{r.kind} engine at {url}"


def open_engine_scraper(
    cfg: Config,
    publish: Callable[[Event], None],
    *,
    upstream: str,
    session: aiohttp.ClientSession | None = None,
) -> EngineScraper | None:
    """The scraper ``cfg.engine`` asks for (not started: run ``scraper.run()`` as a task),
    or None when ``engine.enabled`` is false or there is no URL to scrape."""
    if not cfg.engine.enabled:
        return None
    url = metrics_url_for(upstream, cfg.engine.metrics_url)
    if not url:
        return None
    return EngineScraper(url, session, publish, interval_s=cfg.engine.interval_s)
