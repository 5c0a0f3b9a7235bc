"""The GPU sampler: a daemon thread that polls a :class:`GpuBackend` off the event loop.

Every ``interval_s`` it reads each selected device and hands one immutable
:class:`~llmtop.events.GpuReading` per device to ``publish`` (``EventBus.publish``: a
thread-safe ``deque.append``) and keeps the latest under a lock for :meth:`latest`. A
device error mid-run gives ``None`` fields or marks the device lost — readings for a lost
device keep coming, with every value ``None``, so screens show "n/a" rather than stale
numbers. Nothing a device does stops the thread; :meth:`stop` does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from llmtop.clock import unix_now
from llmtop.events import Event, GpuReading
from llmtop.gpu.backend import GpuBackend, GpuUnavailable


class GpuSampler(threading.Thread):
    """Samples ``devices`` (empty: all) of ``backend`` every ``interval_s`` seconds.

    ``backend.init()`` is called in the thread (a no-op if the caller already did) and
    ``backend.shutdown()`` when it ends.
    """

    def __init__(
        self,
        backend: GpuBackend,
        publish: Callable[[Event], None],
        *,
        interval_s: float = 0.5,
        devices: Sequence[int] = (),
        clock: Callable[[], float] = unix_now,
    ) -> None:
        super().__init__(name="llmtop-gpu-sampler", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._backend = backend
        self._publish = publish
        self._interval_s = interval_s
        self._wanted = tuple(devices)
        self._clock = clock
        self._stop_evt = threading.Event()
        self._lock = threading.Lock()
        self._latest: dict[int, GpuReading] = {}
        self._status = "starting"
        self._errors: dict[int, str] = {}
        self.rounds = 0
        """Completed sampling rounds (all devices read once)."""
        self.unavailable: str | None = None
        """Set when the sampler produces no readings at all: the reason, one line."""

    # -- what others read ------------------------------------------------------------------

    @property
    def status(self) -> str:
        """One line: "2 GPUs", "2 GPUs; GPU 1 lost", "no NVML library (...)", "stopped"."""
        with self._lock:
            return self._status

    def latest(self) -> list[GpuReading]:
        """The most recent reading of each sampled device, by index."""
        with self._lock:
            return [self._latest[i] for i in sorted(self._latest)]

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Ask the thread to finish and wait up to ``timeout`` s; True if it has ended."""
        self._stop_evt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        return not self.is_alive()

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        try:
            try:
                self._backend.init()
            except GpuUnavailable as exc:
                self.unavailable = exc.reason
                self._set_status(exc.reason)
                return
            indices = self._select()
            if indices is None:
                return
            next_t = time.monotonic()
            while not self._stop_evt.is_set():
                self._round(indices)
                next_t += self._interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (slow NVML calls): don't try to catch up
                    next_t = time.monotonic()
                    delay = 0.0
                self._stop_evt.wait(delay)
        except Exception as exc:  # last line of defence: report, never a dead silent thread
            self.unavailable = f"GPU sampler failed: {type(exc).__name__}: {exc}"
            self._set_status(self.unavailable)
        finally:
            self._backend.shutdown()
            if self.unavailable is None:
                self._set_status("stopped")

    def _select(self) -> list[int] | None:
        count = self._backend.device_count()
        if not self._wanted:
            return [i for i in range(count) if self._backend.accessible(i)]
        wanted = list(dict.fromkeys(self._wanted))  # "--gpus 0,0": read once a round
        missing = [i for i in wanted if not 0 <= i < count]
        denied = [i for i in wanted if 0 <= i < count and not self._backend.accessible(i)]
        present = [i for i in wanted if i not in missing and i not in denied]
        if missing:
            have = f"NVML sees {count} GPU{'s' if count != 1 else ''}"
            self._errors[-2] = f"GPU {','.join(map(str, missing))} not present ({have})"
        if denied:
            self._errors[-1] = (f"GPU {','.join(map(str, denied))} not accessible to this "
                                "process (no permission)")
        if not present:
            self.unavailable = "; ".join(m for _, m in sorted(self._errors.items()))
            self._set_status(self.unavailable)
            return None
        return present

    def _round(self, indices: Sequence[int]) -> None:
        for i in indices:
            if self._stop_evt.is_set():
                return
            t = self._clock()
            try:
                reading = self._backend.read(i, t)
                self._errors.pop(i, None)
            except Exception as exc:  # a backend bug must not kill sampling of other GPUs
                self._errors[i] = f"GPU {i} error: {type(exc).__name__}: {exc}"
                reading = self._empty(i, t)
            self._publish(reading)
            with self._lock:
                self._latest[i] = reading
        self.rounds += 1
        self._set_status(self._describe(indices))

    def _empty(self, index: int, t: float) -> GpuReading:
        with self._lock:
            prev = self._latest.get(index)
        name = prev.name if prev else f"GPU {index}"
        return GpuReading(t=t, index=index, name=name, mem_used_bytes=None, mem_total_bytes=None)

    def _describe(self, indices: Sequence[int]) -> str:
        n = len(indices)
        parts = [f"{n} GPU{'s' if n != 1 else ''}"]
        lost = [i for i in indices if self._backend.lost(i)]
        if lost:
            parts.append(f"GPU {','.join(map(str, lost))} lost")
        parts.extend(msg for key, msg in sorted(self._errors.items()) if key not in lost)
        for i in indices:
            err = None if i in lost or i in self._errors else self._backend.last_error(i)
            if err:
                parts.append(f"GPU {i} {err}")
        return "; ".join(parts)

    def _set_status(self, status: str) -> None:
        with self._lock:
            self._status = status
