"""Open requests per worker of ``llmtop run --workers N``, in a small shared mapped file.

A record's ``concurrency_at_start`` counts every open request of the whole proxy, not only
its own worker's. Each worker writes its own count into one 8-byte slot as a request opens
or closes, and sums the other slots when a request opens: exact at that moment, for the
cost of a few hundred nanoseconds, where the coordinator's last report (what workers used
before) was up to two forwarding intervals old.

The coordinator creates the file (in ``/dev/shm`` where there is one with room), opens it
and removes its name at once; each worker maps it at start-up through the descriptor it inherits
(``/dev/fd/N``, :mod:`llmtop.worker_procs`), a restarted one too: the mappings stay valid
and nothing is left behind, even after a crash. Slots are aligned
8-byte integers, written and read whole.

A second row of slots holds each worker process's running total of requests opened (bumped
with its open count, as one opens): when a worker is killed, the coordinator subtracts the
records it received from that process and the requests its last report had open, and what
is left are the requests no report carried — opened and ended (or still open) after its
last report, their records dead in its buffer. Without it, a worker killed half a second
after six short requests had served them was one request and no error on every figure. The
coordinator zeroes both of a worker's slots once its process has exited, before it starts
the next one.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
from collections.abc import Sequence

SLOT_BYTES = 8
SHARED_DIRS: tuple[str | None, ...] = ("/dev/shm", None)
"""Where the table is made: memory-backed where there is one; else the temporary
directory."""


class FleetCounts:
    """The slot table; ``index`` is this process's own slot (``-1``: the coordinator). Two
    rows of one slot per worker: the open requests, then the requests opened so far."""

    def __init__(self, mm: mmap.mmap, index: int) -> None:
        slots = len(mm) // SLOT_BYTES // 2
        if slots < 1 or len(mm) != 2 * slots * SLOT_BYTES or not -1 <= index < slots:
            mm.close()
            raise ValueError(f"slot {index} is not in a table of {slots}")
        self._mm = mm
        view = memoryview(mm).cast("q")
        self._all = view
        self._slots = view[:slots]
        """Open requests per worker."""
        self._opened = view[slots:]
        """Requests opened per worker process (zeroed when the process has exited)."""
        self.index = index

    @classmethod
    def create(cls, workers: int, dirs: Sequence[str | None] = SHARED_DIRS,
               ) -> tuple[FleetCounts, str]:
        """A zeroed table of ``workers`` slots (and as many running totals), and the path
        the workers attach to; in the first of ``dirs`` where one can be made (None: the
        temporary directory)."""
        error: OSError | None = None
        for d in dirs:
            try:
                fd, path = tempfile.mkstemp(prefix="llmtop-fleet-", dir=d)
            except OSError as exc:
                error = exc
                continue
            size = 2 * SLOT_BYTES * workers
            try:
                # the bytes written, not only the size set: a file on a full tmpfs is made
                # and mapped all the same, and the first write to the page is then SIGBUS
                # (a worker at its first request, the coordinator clearing a slot); ENOSPC
                # now, and the next place is tried
                if os.pwrite(fd, bytes(size), 0) != size:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                mm = mmap.mmap(fd, size)
            except OSError as exc:
                os.unlink(path)
                error = exc
                continue
            except BaseException:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
            return cls(mm, -1), path
        assert error is not None
        raise error

    @classmethod
    def attach(cls, path: str, index: int) -> FleetCounts:
        """Map the coordinator's table as worker ``index`` (``OSError``, ``ValueError``)."""
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        return cls(mm, index)

    def set_mine(self, n: int) -> None:
        """This worker has ``n`` open requests now."""
        self._slots[self.index] = n

    def opened_one(self, n: int) -> None:
        """This worker opened a request: ``n`` open now, and one more opened in all."""
        i = self.index
        self._slots[i] = n
        self._opened[i] += 1

    def gave_up(self, records: int) -> None:
        """This worker gave up ``records`` finished requests' records (its buffer was full,
        or the coordinator refused them): they leave its running total of requests opened,
        so its death does not count them again as unreported — they are missing from the
        counts, as ``EVENTS_LOST`` already says of them (it counted them once, as given up;
        counted again at the death, the warning read twice as many)."""
        if self.index >= 0 and records > 0:
            self._opened[self.index] -= records

    def others(self) -> int:
        """Open requests of every other worker."""
        slots = self._slots
        return sum(slots) - slots[self.index] if self.index >= 0 else sum(slots)

    def clear(self, index: int) -> None:
        """Worker ``index`` is gone (the coordinator's call, once the process has exited):
        the others no longer count its requests, and its next process counts its opened
        requests from 0."""
        self._slots[index] = 0
        self._opened[index] = 0

    def count(self, index: int) -> int:
        return int(self._slots[index])

    def opened(self, index: int) -> int:
        """Requests worker ``index``'s process has opened so far."""
        return int(self._opened[index])

    def close(self) -> None:
        self._slots.release()
        self._opened.release()
        self._all.release()
        self._mm.close()

