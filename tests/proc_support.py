"""What the tests read of processes from /proc (Linux), and a headless ``llmtop run``
started as a process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

LISTEN = "llmtop: proxy listening on "
ADMIN = "llmtop: admin listening on "


async def start_headless(*args: str) -> tuple[asyncio.subprocess.Process, str, str]:
    """``llmtop run --headless ARGS`` (this tree's code), its output piped; the process and
    the proxy and admin addresses it announced."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "run", "--headless", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    proxy = admin = ""
    while not (proxy and admin):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "llmtop run exited before announcing its addresses"
        if line.startswith(LISTEN):
            proxy = line[len(LISTEN):].strip()
        elif line.startswith(ADMIN):
            admin = line[len(ADMIN):].strip()
    return proc, proxy, admin


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
