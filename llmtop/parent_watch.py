"""A llmtop process started by another llmtop process stops when its parent is gone.

``llmtop run`` (the TUI) runs its proxy as a child, ``llmtop demo`` runs three, and the
coordinator of ``--workers N`` runs N workers, each in a session of its own (so a Ctrl-C
reaches the parent alone, which stops them in order). A parent that is killed outright
(``kill -9``, the OOM killer) gets no say: its children lived on — workers serving the
port with nobody collecting their records, a TUI's proxy holding its ports. Now the
parent names itself in :data:`ENV` when it starts a child (:func:`child_env`); the child
(:func:`watch_parent`, called by the CLI before any command runs) checks once a second
that its parent process is still that one, and when it is not sends itself ``SIGTERM``:
the graceful shutdown every long-running command already has (in-flight streams get
their grace period, a recording is closed properly).

The variable is taken out of the child's environment, so nothing it starts inherits it,
and it is ignored unless it names the process's actual parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Final

ENV: Final = "LLMTOP_PARENT_PID"
INTERVAL_S: Final = 1.0


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a llmtop child of this process: it stops if this one dies."""
    env = dict(os.environ if base is None else base)
    env[ENV] = str(os.getpid())
    return env


def watch_parent(interval_s: float = INTERVAL_S) -> bool:
    """Watch the parent named in :data:`ENV` (if it is this process's parent); True when
    a watch started."""
    value = os.environ.pop(ENV, "")
    try:
        parent = int(value)
    except ValueError:
        return False
    if parent <= 1 or os.getppid() != parent:
        return False

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        with contextlib.suppress(OSError):  # its pipe may have gone with it
            print(f"llmtop: the llmtop process that started this one ({parent}) is gone: "
                  "stopping", file=sys.stderr, flush=True)
        _quiet()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="llmtop-parent-watch", daemon=True).start()
    return True


def _quiet() -> None:
    """Point stdout and stderr at /dev/null: the parent read them through pipes that died
    with it, and a shutdown that prints ("stopping…", "served…") would die of EPIPE half
    way — before the recording is closed and the streams have finished."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd in (1, 2):
            os.dup2(null, fd)
        os.close(null)
