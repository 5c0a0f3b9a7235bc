"""What the tests read of processes from /proc (Linux)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """``pid``'s child processes, whichever of its threads started them (each thread's
    ``children`` file lists its own); none once it is gone."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(k) for k in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on."""
    out: list[int] = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out
