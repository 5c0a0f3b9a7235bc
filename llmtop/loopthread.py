"""An asyncio event loop of its own, in a thread of its own.

One-process llmtop runs its observers here (aggregation, detectors, recording control,
samplers, the admin API): the proxy's loop then only forwards bytes and publishes events,
and nothing the observers do — a snapshot for the TUI, a burst of a thousand records, a
slow ``/metrics`` scrape — ever sits in front of a chunk in the proxy loop's queue. The two
threads share the GIL, which the interpreter hands over every
``sys.getswitchinterval()`` (0.5 ms in a running proxy, see ``llmtop.server``), so the
proxy waits at most that long for it.

Crossing over: :meth:`LoopThread.call` runs a coroutine on this loop and awaits its result
from another loop; what the observers share with the proxy is the event bus (a deque:
``append`` and ``popleft`` are atomic) and the registry of open requests (read as
``list(d.values())``, one C-level copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A running event loop on a daemon thread; :meth:`close` stops and joins it."""

    def __init__(self, name: str = "llmtop-observers") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            with contextlib.suppress(RuntimeError):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and return its result (or raise its exception)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # already closed
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
