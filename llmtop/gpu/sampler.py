"""The GPU sampler: a daemon thread that polls a :class:`GpuBackend` off the event loop.

Every ``interval_s`` it reads each selected device and hands one immutable
:class:`~llmtop.events.GpuReading` per device to ``publish`` (``EventBus.publish``: a
thread-safe ``deque.append``) and keeps the latest under a lock for :meth:`latest`. A
device error mid-run gives ``None`` fields or marks the device lost — readings for a lost
device keep coming, with every value ``None``, so screens show "n/a" rather than stale
numbers. Nothing a device does stops the thread; :meth:`stop` does.

Each device is read in a thread of its own (:class:`_Reader`), which the sampler thread
asks for a reading each round and waits for until the next round is due: a GPU whose
NVML calls take seconds, or never return (a GPU in a bad state), holds up only its own
readings. While a call of it is overdue the status names it ("GPU 1 not answering ...")
and its readings come with every value None, as a lost GPU's do; it is asked again once
that call returns, and that late reading is stamped when it came.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from llmtop.clock import unix_now
from llmtop.events import Event, GpuReading
from llmtop.gpu.backend import GpuBackend, GpuUnavailable

SLOW_READ_S = 1.0
"""A device read still running after this long (or two intervals, if longer) is reported
as not answering in :attr:`GpuSampler.status`."""
READER_JOIN_S = 1.0
"""How long the sampler thread, stopping, waits for its device threads to end."""

_Result = tuple[int, float, GpuReading | None, str | None]
"""(device index, time stamped, the reading or None, the error if the read raised)."""


class _Reader(threading.Thread):
    """Reads one device of ``backend`` when asked (:meth:`request`), in a daemon thread of
    its own, and puts a :data:`_Result` on ``done``. ``busy_since`` is set and cleared by
    the sampler thread only."""

    def __init__(self, backend: GpuBackend, index: int,
                 done: queue.SimpleQueue[_Result | None]) -> None:
        super().__init__(name=f"llmtop-gpu-read-{index}", daemon=True)
        self._backend = backend
        self.index = index
        self._done = done
        self._requests: queue.SimpleQueue[float | None] = queue.SimpleQueue()
        self.busy_since: float | None = None
        """``time.monotonic()`` when the read in progress was asked for; None: idle."""

    def request(self, t: float) -> None:
        self.busy_since = time.monotonic()
        self._requests.put(t)

    def finish(self) -> None:
        self._requests.put(None)

    def run(self) -> None:
        while (t := self._requests.get()) is not None:
            try:
                result: _Result = (self.index, t, self._backend.read(self.index, t), None)
            except Exception as exc:  # a backend bug must not kill sampling of other GPUs
                result = (self.index, t, None,
                          f"GPU {self.index} error: {type(exc).__name__}: {exc}")
            self._done.put(result)


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
        self._done: queue.SimpleQueue[_Result | None] = queue.SimpleQueue()
        self._slow_s = max(SLOW_READ_S, 2 * interval_s)
        """A read running this long: the device is "not answering"."""
        self._blanked: set[int] = set()
        """Devices given n/a readings while not answering, their late reading not yet in."""
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
        """Ask the thread to finish and wait up to ``timeout`` s; True if it has ended.

        A device thread still inside an NVML call is left to it (a daemon thread), and
        NVML is then not shut down under that call."""
        self._stop_evt.set()
        self._done.put(None)  # wakes the sampler thread waiting for readings
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        return not self.is_alive()

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        readers: dict[int, _Reader] = {}
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
            for i in indices:
                readers[i] = _Reader(self._backend, i, self._done)
                readers[i].start()
            next_t = time.monotonic()
            while not self._stop_evt.is_set():
                self._round(indices, readers, next_t + self._interval_s)
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
            if self._end_readers(readers):
                self._backend.shutdown()
            if self.unavailable is None:
                self._set_status("stopped")

    @staticmethod
    def _end_readers(readers: Mapping[int, _Reader]) -> bool:
        """Ask the device threads to end and wait for them, up to :data:`READER_JOIN_S` in
        all; False if one is still inside a read (NVML must then stay up under it). A
        read that ends in that time (asked for just before stop) lets its thread end."""
        for r in readers.values():
            r.finish()
        deadline = time.monotonic() + READER_JOIN_S
        for r in readers.values():
            r.join(max(0.0, deadline - time.monotonic()))
        return not any(r.is_alive() for r in readers.values())

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

    def _round(self, indices: Sequence[int], readers: Mapping[int, _Reader],
               deadline: float) -> None:
        """Ask every idle device for a reading and wait for them until ``deadline`` (the
        next round's start); publish what came, in ``indices`` order. A device still busy
        is not asked again: its reading is published in the round its call returns."""
        results: dict[int, _Result] = {}
        self._collect(readers, results, 0.0)  # late readings of earlier rounds
        for i in indices:
            if self._stop_evt.is_set():
                break
            if readers[i].busy_since is None and i not in results:
                readers[i].request(self._clock())
        while any(r.busy_since is not None for r in readers.values()):
            wait = deadline - time.monotonic()
            if wait <= 0 or self._stop_evt.is_set() or not self._collect(readers, results,
                                                                           wait):
                break
        now = time.monotonic()
        for i in indices:
            if i not in results:
                since = readers[i].busy_since
                if since is None or now - since < self._slow_s:
                    continue
                # not answering: n/a, as a lost GPU reads, not its last figures
                reading = self._empty(i, self._clock())
                self._blanked.add(i)
            else:
                _, t, got, error = results[i]
                if i in self._blanked:  # late: stamped after the n/a readings before it
                    self._blanked.discard(i)
                    t = self._clock()
                    got = None if got is None else dataclasses.replace(got, t=t)
                if got is None:
                    self._errors[i] = error or f"GPU {i} error"
                    got = self._empty(i, t)
                else:
                    self._errors.pop(i, None)
                reading = got
            self._publish(reading)
            with self._lock:
                self._latest[i] = reading
        self.rounds += 1
        self._set_status(self._describe(indices, readers))

    def _collect(self, readers: Mapping[int, _Reader], into: dict[int, _Result],
                 wait: float) -> bool:
        """Take the readings that have come (waiting up to ``wait`` s for the first);
        False when none came in that time or :meth:`stop` woke the thread."""
        try:
            item = self._done.get(timeout=wait) if wait > 0 else self._done.get_nowait()
        except queue.Empty:
            return False
        while item is not None:
            readers[item[0]].busy_since = None
            into[item[0]] = item
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                return True
        return False

    def _empty(self, index: int, t: float) -> GpuReading:
        with self._lock:
            prev = self._latest.get(index)
        name = prev.name if prev else f"GPU {index}"
        return GpuReading(t=t, index=index, name=name, mem_used_bytes=None, mem_total_bytes=None)

    def _describe(self, indices: Sequence[int], readers: Mapping[int, _Reader]) -> str:
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
        now = time.monotonic()
        for i in indices:
            since = readers[i].busy_since
            if since is not None and now - since >= self._slow_s:
                parts.append(f"GPU {i} not answering (an NVML call has run for "
                             f"{now - since:.0f} s)")
        return "; ".join(parts)

    def _set_status(self, status: str) -> None:
        with self._lock:
            self._status = status
