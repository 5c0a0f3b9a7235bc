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

import json
import math
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import aiohttp

from llmtop.clock import unix_now
from llmtop.events import Event, GpuReading
from llmtop.polling import Poller

_NUMERIC = tuple(
    f.name for f in fields(GpuReading) if f.name not in ("t", "index", "name", "simulated")
)
_INT_FIELDS = ("mem_used_bytes", "mem_total_bytes")
MAX_BYTES = 1024 * 1024
"""Largest ``/sim/gpu`` body read (the simulator's is well under 1 KB a GPU)."""


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


class SimGpuSource(Poller[list[GpuReading]]):
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
        clock: Callable[[], float] = unix_now,
        max_backoff_s: float = 10.0,
    ) -> None:
        super().__init__(url, session, interval_s=interval_s, max_backoff_s=max_backoff_s)
        self._publish = publish
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: list[GpuReading] = []
        self.status = f"simulated GPU: waiting for {self.shown}"
        """One line for the UI: "1 simulated GPU" or why the last poll failed."""
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
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ValueError(f"larger than {MAX_BYTES} bytes: not the simulator's "
                                     "/sim/gpu")
                chunks.append(chunk)
        doc = json.loads(b"".join(chunks))
        readings = readings_from_json(doc, self._clock())
        for r in readings:
            self._publish(r)
        with self._lock:
            self._latest = readings
        self.polls += 1
        return readings

    async def once(self, session: aiohttp.ClientSession) -> list[GpuReading]:
        return await self.poll_once(session)

    def describe(self, result: list[GpuReading]) -> str:
        n = len(result)
        return f"{n} simulated GPU{'s' if n != 1 else ''}"

    def explain(self, exc: Exception) -> str:
        why = str(exc) or type(exc).__name__
        why = why.replace(self.url, self.shown)  # (aiohttp's errors may name the URL)
        return f"simulated GPU unavailable at {self.shown}: {why}; retrying"

