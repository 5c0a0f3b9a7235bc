"""The simulated GPU of ``llmtop sim`` as a source of GPU readings.

The simulator serves ``GET /sim/gpu``::

    {"gpus": [{"index": 0, "name": "...", "mem_used_bytes": ..., "mem_total_bytes": ...,
               "util_gpu": ..., "mem_busy": ..., "dram_bw_util": ..., "power_w": ...,
               "simulated": true}]}

:class:`SimGpuSource` polls it and publishes :class:`~llmtop.events.GpuReading` with
``simulated=True`` — always, whatever the JSON says, so a simulated reading can never pass
for a real one. Other ``GpuReading`` fields present in the JSON (``sm_activity``,
``temperature_c`` ...) are taken too. Errors become :attr:`SimGpuSource.status` and a
retry with back-off; the loop ends only when cancelled.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import aiohttp

from llmtop.events import Event, GpuReading

_NUMERIC = tuple(
    f.name for f in fields(GpuReading) if f.name not in ("t", "index", "name", "simulated")
)
_INT_FIELDS = ("mem_used_bytes", "mem_total_bytes")


def readings_from_json(doc: Any, t: float) -> list[GpuReading]:
    """``/sim/gpu`` JSON → readings (``simulated=True``). Raises ValueError if malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise ValueError('expected {"gpus": [...]}')
    out: list[GpuReading] = []
    for n, g in enumerate(doc["gpus"]):
        if not isinstance(g, dict):
            raise ValueError(f"gpus[{n}] is not an object")
        index = g.get("index", n)
        if not isinstance(index, int) or isinstance(index, bool):
            raise ValueError(f"gpus[{n}].index is not an integer")
        kw: dict[str, Any] = {}
        for key in _NUMERIC:
            v = g.get(key)
            if v is None:
                kw[key] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"gpus[{n}].{key} is not a number: {v!r}")
            kw[key] = int(v) if key in _INT_FIELDS else float(v)
        out.append(
            GpuReading(t=t, index=index, name=str(g.get("name") or f"sim GPU {index}"),
                       simulated=True, **kw)
        )
    return out


class SimGpuSource:
    """Polls ``url`` (the simulator's ``/sim/gpu``) every ``interval_s`` seconds.

    With ``session=None`` it opens its own ``aiohttp.ClientSession`` for the life of
    :meth:`run` and closes it on the way out.
    """

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession | None,
        publish: Callable[[Event], None],
        *,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        max_backoff_s: float = 10.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.url = url
        self._session = session
        self._publish = publish
        self._interval_s = interval_s
        self._clock = clock
        self._max_backoff_s = max(max_backoff_s, interval_s)
        self._lock = threading.Lock()
        self._latest: list[GpuReading] = []
        self.status = f"simulated GPU: waiting for {url}"
        """One line for the UI: "1 simulated GPU" or why the last poll failed."""
        self.failures = 0
        """Consecutive failed polls (0 after a success)."""
        self.polls = 0
        """Successful polls."""

    def latest(self) -> list[GpuReading]:
        """The readings of the last successful poll."""
        with self._lock:
            return list(self._latest)

    async def poll_once(self, session: aiohttp.ClientSession) -> list[GpuReading]:
        """One GET; publishes and returns the readings. Raises on any failure."""
        timeout = aiohttp.ClientTimeout(total=max(2.0, 4 * self._interval_s))
        async with session.get(self.url, timeout=timeout) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            doc = await resp.json(content_type=None)
        readings = readings_from_json(doc, self._clock())
        for r in readings:
            self._publish(r)
        with self._lock:
            self._latest = readings
        self.polls += 1
        return readings

    def _delay(self) -> float:
        if not self.failures:
            return self._interval_s
        return min(self._interval_s * 2.0 ** min(self.failures, 16), self._max_backoff_s)

    async def run(self) -> None:
        """Poll until cancelled. Never raises anything but CancelledError."""
        own = self._session is None
        session = aiohttp.ClientSession() if own else self._session
        assert session is not None
        try:
            while True:
                try:
                    readings = await self.poll_once(session)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.failures += 1
                    why = str(exc) or type(exc).__name__
                    self.status = f"simulated GPU unavailable at {self.url}: {why}; retrying"
                else:
                    self.failures = 0
                    n = len(readings)
                    self.status = f"{n} simulated GPU{'s' if n != 1 else ''}"
                await asyncio.sleep(self._delay())
        finally:
            if own:
                await session.close()
