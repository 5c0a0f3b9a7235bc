"""Which parts of a rotating recording a live process is writing: an advisory lock on each
part's own open file.

Two recorders can write one stem at once — a restart that overlaps the old process (systemd
starting the new one before the old one has drained), or two proxies given the same
``--record`` — and a recorder's ``keep`` counts the parts an earlier run left: without a
word it deleted the part the other process was writing (that process then stopped
recording, "the file is no longer at its path"). So a recorder holds ``flock(LOCK_EX)`` on
each part it writes, from the moment the file is made (before its header: no other
recorder counts a file as a part before it has one) until it is closed, and ``keep``
leaves a part whose lock it cannot share (:func:`held_elsewhere`).

The lock is on the part itself, not on a ``STEM.lock`` file beside it: it says exactly
which file is in use (the part ``keep`` must leave, and the one a second recorder's
warning names), it moves with rotation without a step of its own, it is the same for
``.jsonl`` and ``.jsonl.gz`` (the compressed stream is written through the same
descriptor), and there is no extra file to leave behind. ``flock`` belongs to the open
file description: the kernel drops it when the process ends however it ends (``kill
-9`` included), so a dead process's part never blocks anything — no stale state to clean.
With ``--workers N`` only the coordinator writes (the workers are started without its
descriptors); ``--split-observers`` likewise.

On a network file system the lock may be seen only by processes on the same host (it
depends on the file system and the kernel: Linux maps ``flock`` on NFS to byte-range
locks, other systems and mounts keep it local): two hosts recording to one stem on shared
storage are not protected — give each its own ``--record``. A file system that does not
lock at all leaves the parts unlocked and recorded as before.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Final

_LOCK_TRIES: Final = 200


def lock_part(fd: int) -> bool:
    """Lock a part just made for writing (``fd``: its descriptor), held until it is
    closed. No one else writes a file this recorder has just made, but another
    recorder starting may be looking at it (:func:`held_elsewhere`'s shared lock, held
    for a moment): tried again for up to ~0.2 s, never waited on unbounded. False when
    it could not be (a file system that does not lock): the part is written all the
    same, unlocked."""
    for _ in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            return False
        else:
            return True
    return False


def held_elsewhere(path: Path, identity: tuple[int, int] | None = None) -> bool | None:
    """Whether a live recorder is writing the part at ``path`` (its lock cannot be shared
    now): True, False (free: finished, or its writer is dead), or None when there is no
    such file — gone, or with ``identity`` (device, inode) not that file any more. The
    look takes a shared lock for a moment, so two recorders looking at once do not see
    each other as writers. A recorder's own part, open in this process, is held too: its
    lock is on another open file description."""
    try:  # (O_NONBLOCK: a FIFO named like a part must not hang the look)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if identity is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != identity:
                return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a file system that does not lock: nothing to go by
            return False
        return False
    finally:
        os.close(fd)  # (and the shared lock with it)
