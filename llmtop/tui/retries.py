"""When an attached proxy that failed is asked again, and its try in the background.

With several proxies, one that never answers (a host that drops packets) made every
refresh of the whole screen wait out the timeout, though the others answered in
milliseconds. A proxy that failed is therefore tried again after a backoff (1 s, 2 s,
4 s … :data:`CAP_S`), each try a task of its own that no refresh waits for beyond the
proxies that answer; the refresh that finds it finished takes its answer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

FIRST_S = 1.0
"""The wait before the first try again after a failure; each failed try doubles it."""
CAP_S = 15.0
"""The longest wait between tries: a proxy back up is shown again within this (plus its
answer's time)."""

T = TypeVar("T")


@dataclass(slots=True)
class _State(Generic[T]):
    due: float
    """When (monotonic s) to try again."""
    failures: int
    task: asyncio.Task[T] | None = None
    """The try on its way or done and not yet taken."""


class Retries(Generic[T]):
    """Per key (a proxy's URL) that failed: when it is tried again, and that try.

    A try is a task whose coroutine never raises (a failure is a value of ``T``): a task
    that nobody awaits must not log "exception never retrieved"."""

    def __init__(self) -> None:
        self._state: dict[str, _State[T]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def failed(self, key: str, at: float) -> None:
        """``key``'s try failed at ``at`` (monotonic s): its next one waits a backoff."""
        old = self._state.get(key)
        failures = 1 if old is None else old.failures + 1
        wait = min(FIRST_S * 2.0 ** min(failures - 1, 16), CAP_S)
        self._state[key] = _State(at + wait, failures)

    def answered(self, key: str) -> None:
        """``key`` answered: asked with the others again, at once."""
        self._state.pop(key, None)

    def start_due(self, now: float, start: Callable[[str], Coroutine[Any, Any, T]], *,
                  every: bool = False) -> None:
        """Start a try for each key due by ``now`` (``every``: each key, due or not) that
        has none on its way or waiting to be taken."""
        for key, state in self._state.items():
            if state.task is None and (every or now >= state.due):
                state.task = asyncio.create_task(start(key), name=f"llmtop retry {key}")

    def pending(self) -> list[asyncio.Task[T]]:
        return [s.task for s in self._state.values()
                if s.task is not None and not s.task.done()]

    def take(self, key: str) -> T | None:
        """``key``'s finished try's result (once), ``None`` while none has finished."""
        state = self._state.get(key)
        task = None if state is None else state.task
        if state is None or task is None or not task.done():
            return None
        state.task = None
        return None if task.cancelled() else task.result()

    def note(self, key: str, now: float) -> str:
        """When ``key`` is tried next, for the warning that names it down ("" when it is
        not waiting to be tried again)."""
        state = self._state.get(key)
        if state is None:
            return ""
        if state.task is not None:
            return " (trying again now)"
        return f" (next try in {max(1, math.ceil(state.due - now))} s)"

    async def close(self) -> None:
        """Cancel the tries on their way, and wait for them to end."""
        tasks = self.pending()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._state.clear()
