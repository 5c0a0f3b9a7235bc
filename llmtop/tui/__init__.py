"""The live terminal UI. It only renders snapshots (the admin API's JSON) from a
:class:`~llmtop.tui.source.SnapshotSource`; it never imports the proxy, NVML or hdrh.

Entry point for commands: :func:`run_tui`. Importing this package does not import
Textual; ``llmtop.tui.app`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading

    from llmtop.tui.source import SnapshotSource


def run_tui(
    source: SnapshotSource,
    *,
    refresh_hz: float = 4.0,
    window_s: int | None = 60,
    title: str = "llmtop",
    proxy: str | None = None,
    admin: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run the TUI on ``source`` until the user quits; returns the exit code.
    The app closes ``source`` when it exits. ``proxy``: the URL clients send requests
    to, and ``admin``: the admin API the source reads, both shown in the header (``run``
    and ``demo`` know them; ``attach`` does not). ``stop``: set from any thread, it ends the
    TUI as ``q`` does."""
    from llmtop.tui.app import run_tui as run

    return run(source, refresh_hz=refresh_hz, window_s=window_s, title=title, proxy=proxy,
               admin=admin, stop=stop)


__all__ = ["run_tui"]
