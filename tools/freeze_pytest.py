"""Run pytest while its whole process tree is paused now and then, as a loaded machine pauses it.

CI runs on a shared 2-core machine whose scheduler sometimes stops the test process for
hundreds of milliseconds. A test whose timing has no room for that fails there, rarely and
never here. This runner makes such pauses happen on purpose: every ``--gap`` seconds
(uniform between the two bounds) it sends SIGSTOP to pytest and every process below it,
waits ``--freeze`` milliseconds, and sends SIGCONT to those it stopped (not to a process
that was stopped already, nor to one that appeared meanwhile: a test's own SIGSTOP stays).
A test that passes under it has room for a pause of that size.

    python tools/freeze_pytest.py [--freeze 200 600] [--gap 1 5] [--seed N] -- PYTEST ARGS

The defaults (200-600 ms every 1-5 s) are what earlier CI failures looked like; pytest's
output goes to this process's, and a last line says how many pauses there were and for how
long in all. The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the name (state first, then the parent), or
    None for a process gone meanwhile."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()  # (the name may hold spaces)


def _children() -> dict[int, list[int]]:
    """Each process's children (from /proc: Linux only)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def tree(root: int) -> list[int]:
    """``root`` and every process below it, parents before their children."""
    children = _children()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def stopped(fields: list[str] | None) -> bool:
    return fields is not None and fields[0] in ("T", "t")


STOP_WAIT_S = 0.05
"""How long a pause waits to see a process it stopped actually stopped."""


def freeze(root: int) -> list[int]:
    """Stop ``root`` and every process below it; returns those stopped here. A process
    found stopped (state T: a test's own SIGSTOP, as the tests of a stuck worker send) is
    left as it is — a SIGCONT of ours would end the test's stop,
    and its test would wait for what then never comes. Parents go first, each seen stopped
    before its children's states are read: a test that stops a child of its own between
    that reading and our SIGSTOP made the child look like ours, and the resume ended the
    test's stop (a CI failure of tests/core/test_freeze_pytest.py)."""
    children = _children()
    mine: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if stopped(stat_fields(pid)):
            continue
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            continue  # ended meanwhile
        mine.append(pid)
        end = time.monotonic() + STOP_WAIT_S
        while not stopped(stat_fields(pid)) and time.monotonic() < end:
            time.sleep(0.0005)
    return mine


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass  # ended meanwhile


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="freeze_pytest.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--freeze", nargs=2, type=float, default=(200.0, 600.0),
                   metavar=("MIN_MS", "MAX_MS"), help="each pause, ms (default 200 600)")
    p.add_argument("--gap", nargs=2, type=float, default=(1.0, 5.0),
                   metavar=("MIN_S", "MAX_S"), help="between pauses, s (default 1 5)")
    p.add_argument("--seed", type=int, default=None, help="for the pauses' random sizes")
    if "--" not in argv:
        if "-h" in argv or "--help" in argv:
            p.parse_args(argv)  # (prints the help and exits)
        print("usage: freeze_pytest.py [--freeze MIN_MS MAX_MS] [--gap MIN_S MAX_S] "
              "[--seed N] -- PYTEST ARGS", file=sys.stderr)
        return 2
    cut = argv.index("--")
    args = p.parse_args(argv[:cut])
    lo, hi = sorted(args.freeze)
    glo, ghi = sorted(args.gap)
    if lo < 0 or glo <= 0:
        p.error("--freeze must be at least 0 ms and --gap above 0 s")
    rng = random.Random(args.seed)
    child = subprocess.Popen([sys.executable, "-m", "pytest", *argv[cut + 1:]])
    pauses, frozen = 0, 0.0
    try:
        while child.poll() is None:
            time.sleep(rng.uniform(glo, ghi))
            if child.poll() is not None:
                break
            mine = freeze(child.pid)
            pause = rng.uniform(lo, hi) / 1000
            time.sleep(pause)
            # only those it stopped: a process that appeared after the pause looked (its
            # parent stopped it at once, as a test does: Popen, then SIGSTOP) was never ours
            signal_all(mine, signal.SIGCONT)
            pauses += 1
            frozen += pause
    except KeyboardInterrupt:
        pass  # pytest got the Ctrl-C too (one process group): let it end and report
    finally:
        if child.poll() is None:
            signal_all(tree(child.pid), signal.SIGCONT)
    while True:
        try:
            rc = child.wait()
            break
        except KeyboardInterrupt:
            continue
    print(f"freeze_pytest: {pauses} pauses, {frozen:.1f} s in all; pytest exit status {rc}",
          flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
