"""``llmtop run``: the proxy in front of an upstream, with the live TUI (or ``--headless``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from urllib.parse import urlsplit

from llmtop.cli.common import (
    Child,
    UsageError,
    add_config_arguments,
    config_from_args,
    interrupt_on_sigterm,
    llmtop_cmd,
    on_hangup,
    probe_new_file,
)
from llmtop.config import (
    MAX_REFRESH_HZ,
    ConfigError,
    check_zone,
    env_name,
    gpu_devices_note,
    unknown_env,
    upstream_tls_note,
    upstream_v1_note,
)

NAME = "run"
HELP = "start the proxy in front of an inference endpoint, with the live TUI"
DESCRIPTION = """\
Start llmtop's streaming proxy in front of UPSTREAM and watch it live.

Point your clients at the proxy address instead of the engine. Every request is
forwarded byte for byte; llmtop timestamps each token on the way through.

With the TUI (default), the proxy runs as a child process and quitting the TUI stops
it gracefully. To keep a proxy running without a screen, use --headless and watch it
from anywhere with `llmtop attach http://ADMIN`.

examples:
  llmtop run --upstream http://127.0.0.1:8000
  llmtop run --upstream http://gpu-box:8000 --listen 0.0.0.0:8080 --record today.jsonl.gz
  llmtop run --upstream http://127.0.0.1:8000 --headless --admin 127.0.0.1:9001
"""

LISTEN_PREFIX = "llmtop: proxy listening on "
ADMIN_PREFIX = "llmtop: admin listening on "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="URL", help="base URL of the inference endpoint")
    add_config_arguments(p)
    p.add_argument(
        "--headless",
        action="store_true",
        help="no TUI: serve until SIGINT/SIGTERM, then shut down gracefully and print a summary",
    )
    p.add_argument("--refresh-hz", type=float, metavar="HZ",
                   help="TUI refreshes per second, at most 60 (default tui.refresh_hz: 4)")


def main(args: argparse.Namespace) -> int:
    if args.refresh_hz is not None and not 0 < args.refresh_hz <= MAX_REFRESH_HZ:
        raise UsageError(f"--refresh-hz {args.refresh_hz:g} must be in (0, {MAX_REFRESH_HZ:g}]")
    cfg = config_from_args(args)
    if not cfg.upstream:
        raise UsageError(
            "--upstream URL is required (or set upstream in --config / LLMTOP_UPSTREAM)"
        )
    try:  # here, not in the config's checks: a zone names an interface of this machine
        # (started, every request failed "host not found"; a report elsewhere reads the
        # same config file)
        check_zone(urlsplit(cfg.upstream).netloc)
    except ConfigError as exc:
        raise UsageError(f"upstream '{cfg.upstream}': {exc}") from None
    if cfg.recording.path:  # (before anything binds or says it listens)
        probe_new_file(cfg.recording.path)
    if not os.environ.get("LLMTOP_PARENT_PID"):  # (a TUI's own proxy: its parent said so)
        note = upstream_v1_note(cfg.upstream, "--upstream" if args.upstream else (
            env_name("upstream") if env_name("upstream") in os.environ else
            f"upstream in {args.config}" if args.config else "upstream"))
        tls = upstream_tls_note(cfg, "--upstream-ca" if args.upstream_ca else "upstream_ca")
        gpus = gpu_devices_note(cfg, "--gpus" if args.gpus else "gpu.devices",
                                "--gpu-source" if args.gpu_source else "gpu.source")
        for line in [*unknown_env(os.environ), *(n for n in (note, tls, gpus) if n)]:
            print(f"llmtop run: warning: {line}", file=sys.stderr, flush=True)
    if args.headless:
        return _headless(args)
    if not sys.stdout.isatty():
        raise UsageError("the TUI needs a terminal; use --headless to run without one")
    return _with_tui(args, cfg.tui.refresh_hz if args.refresh_hz is None else args.refresh_hz,
                     cfg.tui.window_s or None, token=cfg.admin_token)


def _headless(args: argparse.Namespace) -> int:
    import asyncio

    from llmtop import pipe_out
    from llmtop.server import StartupError, serve_until_signal

    cfg = config_from_args(args)
    install_uvloop()
    if cfg.workers > 1 or cfg.split_observers:
        from llmtop.workers import run_workers

        return run_workers(cfg, args.config)
    try:
        summary = asyncio.run(serve_until_signal(cfg))
    except StartupError as exc:
        pipe_out.say(f"llmtop run: error: {exc}", sys.stderr)
        return 2
    for line in summary.lines():
        pipe_out.say(line)
    return 0


def install_uvloop() -> None:
    """uvloop's event loop for what follows (the proxy, its workers, the coordinator):
    about a third less CPU per forwarded chunk than asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return
    uvloop.install()


def child_command(argv: Sequence[str]) -> list[str]:
    """The same ``run`` arguments for a headless child. Its admin API is where headless
    ``run`` would put it (``--admin``, the config's ``admin``, ``LLMTOP_ADMIN``, else the
    default 127.0.0.1:8081, as ``shared/docs/interfaces.md`` gives): Prometheus, ``attach``
    and ``curl`` find a proxy behind the TUI where they find a headless one."""
    return llmtop_cmd("run", *argv, "--headless")


def _with_tui(args: argparse.Namespace, refresh_hz: float, window_s: int | None = 60, *,
              token: str = "") -> int:
    """The proxy as a headless child and the TUI on it; ``window_s`` the initial window
    (``tui.window_s``; None: the whole session); ``token`` the admin token the child
    requires (``admin_token`` from flag, environment or file, as the child reads it)."""
    from llmtop.tui import run_tui
    from llmtop.tui.source import SHARED_SNAPSHOT_AGE_S, AdminSource
    from llmtop.worker_procs import describe_exit

    raw: list[str] = list(getattr(args, "_argv", []))
    argv = [a for a in raw[raw.index(NAME) + 1 :] if a != "--headless"] if NAME in raw else []
    interrupt_on_sigterm()
    child = Child(child_command(argv), (LISTEN_PREFIX, ADMIN_PREFIX))
    if not child.ready:
        child.stop(5)
        print(f"llmtop run: the proxy did not start: {child.failure()}", file=sys.stderr)
        return child.proc.returncode or 1
    tui_done, died, ending = threading.Event(), threading.Event(), threading.Event()

    def watch_child() -> None:
        """The proxy exited under the TUI (killed, or an error after start-up): end the
        TUI as q does, and say why after it, instead of 'DISCONNECTED' for ever. (The TUI
        polls ``died``; a SIGTERM to ourselves, as before, could land where Textual or
        asyncio catches the KeyboardInterrupt it raises: in the full test suite the TUI
        once ran on for 30 s.)"""
        child.proc.wait()
        if not tui_done.is_set() and not ending.is_set():  # (ending: a hang-up stopped it)
            died.set()
            ending.set()

    threading.Thread(target=watch_child, name="llmtop-child-watch", daemon=True).start()
    on_hangup(ending, child.stop, tui_done)
    hurry = threading.Event()

    def terminated(signum: int, frame: object) -> None:
        """SIGTERM or SIGINT once the TUI runs: it ends as q does (it polls ``ending``).
        A KeyboardInterrupt raised here landed inside one of Textual's tasks, which asyncio
        then reported at exit as "Task exception was never retrieved", a traceback under
        the summary (CI, twice SIGTERM on a loaded machine). Once the TUI has ended, the
        wait for the proxy takes it as "stop now" (:func:`_stop_child`); a second one that
        comes before that is kept for it (``hurry``)."""
        if tui_done.is_set():
            raise KeyboardInterrupt
        if ending.is_set():
            hurry.set()
        ending.set()

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, terminated)
    proxy_url, admin_url = child.found[LISTEN_PREFIX], child.found[ADMIN_PREFIX]
    # The addresses, as --headless prints them, before the TUI takes the screen: the TUI
    # draws on the terminal's alternate screen, so these stay on the main one (and in its
    # scrollback and any log of the session) and are there again when the TUI exits —
    # with --admin :0 the only record of the port to `attach` or `curl` outside the TUI.
    print(f"{LISTEN_PREFIX}{proxy_url}", flush=True)
    print(f"{ADMIN_PREFIX}{admin_url}", flush=True)
    code = 0
    try:
        code = run_tui(
            AdminSource([admin_url], token=token,
                        max_age_s=SHARED_SNAPSHOT_AGE_S),
            refresh_hz=refresh_hz,
            window_s=window_s,
            title=f"llmtop — {proxy_url}",
            proxy=proxy_url,
            admin=admin_url,
            stop=ending,
        )
    except KeyboardInterrupt:  # SIGTERM (or SIGINT): stop as q does, summary included
        code = 0
    finally:
        tui_done.set()
        _stop_child(child, hurry.is_set())
    if died.is_set():
        print(f"llmtop run: the proxy exited ({describe_exit(child.proc.returncode)}): "
              f"{child.failure()}", file=sys.stderr)
        return 1
    summary = [line for line in child.lines  # its summary: served, recording, restarts
               if line.startswith("llmtop:") and "listening on" not in line
               and not line.startswith("llmtop: stopping")]
    with contextlib.suppress(OSError):  # the terminal hung up: nobody to tell
        for line in summary:
            print(line, flush=True)
    return code


def _stop_child(child: Child, hurry: bool = False) -> None:
    """Stop the proxy gracefully. A second SIGTERM or Ctrl-C while it finishes its
    in-flight streams is passed on (its own "stop now": what is still open is cancelled)
    and the wait goes on: before, the KeyboardInterrupt escaped this wait, the TUI exited
    130 without the proxy's summary, and the proxy was hurried only by its parent watch."""
    if hurry and child.proc.poll() is None:  # stopped twice already: its first SIGTERM
        child.proc.send_signal(signal.SIGTERM)  # now, and child.stop() sends "stop now"
    while True:
        try:
            child.stop()  # (again: a further SIGTERM to a proxy already stopping)
            return
        except KeyboardInterrupt:
            continue
