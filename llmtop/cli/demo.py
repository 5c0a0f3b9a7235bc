"""``llmtop demo``: simulated engine + ramping traffic + proxy (recording) + TUI, one command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from llmtop.cli.common import (
    Child,
    RuntimeFailure,
    UsageError,
    interrupt_on_sigterm,
    llmtop_cmd,
    on_hangup,
    probe_new_file,
)

NAME = "demo"
HELP = "simulated engine + traffic past saturation + proxy + TUI, on any machine"
DESCRIPTION = """\
Everything in one command, no GPU needed: llmtop's simulated engine (profile `tiny`,
which saturates at a handful of concurrent requests), the proxy in front of it
recording the session, and traffic from three users (alice, bob, carol) that ramps
concurrency from 1 to --peak (16: four times the 4 requests `tiny` serves at once) and
back, every --period (two minutes) — so you see latency, queueing, saturation warnings
and the capacity estimate move. `q` or Ctrl-C stops everything it started; so does
--duration. Should one of them die (the engine, the proxy or the traffic), the demo
stops the others and exits 1 with a line that says which and how.
"""

MAX_PEAK = 1000
"""Highest --peak: the driver runs one task per unit of peak concurrency, all started at
once (the tiny engine saturates at 4; --peak 1000000000 ate memory without sending)."""

WATCH_INTERVAL_S = 0.2
"""How often the demo checks that its processes still run."""

SIM_PREFIX = "llmtop: sim listening on "
LISTEN_PREFIX = "llmtop: proxy listening on "
ADMIN_PREFIX = "llmtop: admin listening on "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="tiny", help="simulator profile (default tiny)")
    p.add_argument("--peak", type=int, default=16, help="peak concurrency of the ramp (16)")
    p.add_argument("--period", type=float, default=120.0, metavar="S",
                   help="seconds for one ramp up and down (120)")
    p.add_argument("--record", metavar="FILE",
                   help="recording file (default demo-YYYYmmdd-HHMMSS.jsonl.gz; '' to skip)")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="proxy address (default: a free loopback port)")
    p.add_argument("--admin", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="admin API address (default: a free loopback port)")
    p.add_argument("--headless", action="store_true",
                   help="no TUI: print the addresses and run until Ctrl-C or --duration")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    p.add_argument("--drive", metavar="URL", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if not 1 <= args.peak <= MAX_PEAK:
        raise UsageError(f"--peak must be 1–{MAX_PEAK}")
    if not 0 < args.period < float("inf"):
        raise UsageError("--period must be a positive number of seconds")
    if args.duration is not None and not 0 < args.duration < float("inf"):
        raise UsageError("--duration must be a positive number of seconds")
    if args.drive:
        return _drive(args)
    record = args.record
    if record is None:
        record = time.strftime("demo-%Y%m%d-%H%M%S.jsonl.gz")
    if record:
        parent = Path(record).resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--record: directory {parent} does not exist")
        try:
            probe_new_file(record)
        except (UsageError, RuntimeFailure) as exc:
            raise type(exc)(f"--record: {exc}") from None

    children: list[Child] = []
    watch = _Watch()
    interrupt_on_sigterm()
    done = threading.Event()
    # SIGHUP (ssh or the terminal gone): the TUI or the headless wait ends on watch.died
    on_hangup(watch.died, lambda: _shutdown(watch, children), done)
    code = 0
    try:
        code = _run(args, record, children, watch)
    except KeyboardInterrupt:
        code = 0
    finally:
        done.set()
        _shutdown(watch, children)
    for child in children:
        for line in child.lines:
            # the summary lines (the start-up "recording to" was printed above)
            if line.startswith(("llmtop: served", "llmtop: recording ")) and \
                    not line.startswith("llmtop: recording to "):
                print(line, flush=True)
    if watch.dead is not None:
        name, child = watch.dead
        others = " and ".join(n for n in watch.names if n != name)
        print(f"llmtop demo: {name} exited ({_how(child)}); stopped {others}",
              file=sys.stderr, flush=True)
        return 1
    return code


def _run(args: argparse.Namespace, record: str, children: list[Child], watch: _Watch
         ) -> int:
    """Start the three processes (appended to ``children`` as they start) and run the TUI
    or wait; the exit code."""
    sim = Child(llmtop_cmd("sim", "--profile", args.profile, "--listen", "127.0.0.1:0"),
                (SIM_PREFIX,))
    children.append(sim)
    if not sim.ready:
        print(f"llmtop demo: the simulator did not start: {sim.failure()}", file=sys.stderr)
        return _start_failure_code(sim)
    sim_url = sim.found[SIM_PREFIX]
    run_args = ["run", "--headless", "--upstream", sim_url, "--listen", args.listen,
                "--admin", args.admin, "--gpu-source", "sim"]
    if record:
        run_args += ["--record", record]
    proxy = Child(llmtop_cmd(*run_args), (LISTEN_PREFIX, ADMIN_PREFIX))
    children.append(proxy)
    if not proxy.ready:
        print(f"llmtop demo: the proxy did not start: {proxy.failure()}", file=sys.stderr)
        return _start_failure_code(proxy)
    proxy_url, admin_url = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    driver = Child(llmtop_cmd("demo", "--drive", proxy_url, "--peak", str(args.peak),
                              "--period", str(args.period)), ())
    children.append(driver)
    tui = not args.headless and sys.stdout.isatty()
    watch.start({"the simulator": sim, "the proxy": proxy, "the traffic driver": driver})
    print(f"llmtop: sim listening on {sim_url}", flush=True)
    print(f"llmtop: proxy listening on {proxy_url}", flush=True)
    print(f"llmtop: admin listening on {admin_url}", flush=True)
    if record:
        print(f"llmtop: recording to {record}", flush=True)
    if not tui:
        _wait(args.duration, watch.died)
        return 0
    from llmtop.tui import run_tui
    from llmtop.tui.source import SHARED_SNAPSHOT_AGE_S, AdminSource

    def terminated(signum: int, frame: object) -> None:
        # the TUI ends as q does (it polls ``died``); a KeyboardInterrupt raised here could
        # land inside one of Textual's tasks, which asyncio reports at exit as "Task
        # exception was never retrieved" (as it did under `llmtop run`'s TUI)
        watch.died.set()

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, terminated)
    # --duration ends the TUI as q does, through the same event (it was read only headless)
    timer = None
    if args.duration is not None:
        timer = threading.Timer(args.duration, watch.died.set)
        timer.daemon = True
        timer.start()
    try:
        return run_tui(AdminSource([admin_url], max_age_s=SHARED_SNAPSHOT_AGE_S),
                       title=f"llmtop demo — {proxy_url}", proxy=proxy_url, admin=admin_url,
                       stop=watch.died)
    finally:
        if timer is not None:
            timer.cancel()


class _Watch:
    """Notices one of the demo's processes exiting while the demo runs: sets ``died`` and
    ``dead`` (its name and :class:`Child`); the TUI polls ``died`` and ends as ``q`` does
    (a SIGTERM to this process, as before, could land where Textual or asyncio catches
    the KeyboardInterrupt it raises). The simulator dying left the proxy
    answering 502 to every request, and the demo carried on as if nothing had happened."""

    def __init__(self) -> None:
        self.died = threading.Event()
        self.dead: tuple[str, Child] | None = None
        self.names: list[str] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, children: dict[str, Child]) -> None:
        """Watch ``children`` (by the names the message gives them) in a thread."""
        self.names = list(children)

        def watch() -> None:
            while not self._closed.wait(WATCH_INTERVAL_S):
                for name, child in children.items():
                    if child.proc.poll() is None:
                        continue
                    with self._lock:
                        if self._closed.is_set():
                            return
                        self.dead = (name, child)
                        self._closed.set()
                        self.died.set()
                    return

        self._thread = threading.Thread(target=watch, name="llmtop-demo-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the demo is about to stop its processes itself)."""
        with self._lock:
            self._closed.set()
        if self._thread is not None:
            self._thread.join()


def _shutdown(watch: _Watch, children: list[Child]) -> None:
    """Stop watching, then stop the processes, last started first. A SIGTERM or Ctrl-C
    meanwhile (the watch's own, should it land late) does not cut this short: no process
    is left behind, and no traceback."""
    while True:
        try:
            watch.close()
            for child in reversed(children):
                child.stop(20)
            return
        except KeyboardInterrupt:
            continue


def _how(child: Child) -> str:
    """``killed by SIGKILL``; ``exit code 1: <its last line>``."""
    from llmtop.worker_procs import describe_exit

    code = child.proc.returncode
    how = describe_exit(code)
    last = [ln.strip() for ln in child.lines if ln.strip()]
    if code is not None and code > 0 and last:
        how += f": {last[-1][:200]}"
    return how


def _start_failure_code(child: Child) -> int:
    """2 when the child refused its arguments (it exits 2 on a usage error: a busy port, a
    bad address or profile), else 1. Its output ends before it has exited, so wait."""
    try:
        code = child.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return 1
    return 2 if code == 2 else 1


def _wait(duration: float | None, died: threading.Event) -> None:
    """Until Ctrl-C, ``duration`` seconds or ``died``."""
    deadline = None if duration is None else time.monotonic() + duration
    with contextlib.suppress(KeyboardInterrupt):
        while deadline is None or time.monotonic() < deadline:
            if died.wait(0.2):
                return


def _drive(args: argparse.Namespace) -> int:
    from llmtop.demo.driver import RampPlan, drive

    plan = RampPlan(peak=args.peak, period_s=args.period)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(drive(args.drive, plan, duration_s=args.duration))
    return 0
