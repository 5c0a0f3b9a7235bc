"""The signals that stop a long-running llmtop process gracefully.

SIGINT (Ctrl-C) and SIGTERM (kill, systemd, ``timeout``), and SIGHUP: the ssh session or
the terminal closed under it. SIGHUP's default action kills the process at once, so a
proxy run over ssh lost its recording's footer (a ``.jsonl.gz`` cut mid-stream) and its
in-flight streams got no grace. Unless the process was started with SIGHUP ignored
(``nohup``, ``setsid``-style launchers): that is a request to outlive the terminal, and an
inherited ``SIG_IGN`` is kept.
"""

from __future__ import annotations

import signal


def hangup_ignored() -> bool:
    """True when SIGHUP is ignored as inherited (``nohup``): leave it so."""
    return signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGINT, SIGTERM and, unless ignored at start (``nohup``), SIGHUP. Read before any
    handler of ours is installed for SIGHUP (afterwards the handler is what it finds, and
    SIGHUP is still in the answer, as wanted)."""
    if hangup_ignored():
        return (signal.SIGINT, signal.SIGTERM)
    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
