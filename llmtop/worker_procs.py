"""The worker processes of ``llmtop run --workers N``: started, watched, restarted, stopped.

The coordinator starts N ``llmtop _worker`` processes on one port (``SO_REUSEPORT``) and
then watches them (:class:`Supervisor`). A worker that exits while the proxy is running —
killed by the OOM killer, a crash in a C extension, a bug — would otherwise leave the
proxy one worker short in silence, its open requests on the live screens for ever and its
count in every other worker's ``concurrency_at_start``. The supervisor says so on the
coordinator's output and raises the ``WORKER_DOWN`` warning (the live views, the recording
and /metrics show it; cleared once every worker serves again), clears the worker's slot in
the shared table of open requests and its rows among the open requests, and starts it
again on the same port (after 0.5 s, then doubling while it keeps failing). A worker that
exits more than :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW_S` is left
stopped, with a line that says so: a worker that cannot live is better reported than
restarted in a loop. The requests it had open are lost with it (their clients see the
connection close); every other worker goes on serving throughout. A worker whose process
runs but which stopped reporting (stopped, or its loop stuck) is named too, with the same
warning, and cleared when it reports again (:data:`SILENT_S`).

The workers map the shared table through a descriptor the coordinator holds
(``/dev/fd/N``, passed at start): the file has no name from the moment it is created, so
a restarted worker maps the same table and nothing is left behind whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from llmtop.clock import child_env as clock_env
from llmtop.clock import unix_now
from llmtop.config import RUN_FLAGS, Config, env_of, parse_hostport
from llmtop.events import WORKER_EXIT_PREFIX, Event, RequestRecord, WarningEvent
from llmtop.fleet_counts import FleetCounts
from llmtop.listen import dual_stack, is_any_v6
from llmtop.parent_watch import child_env
from llmtop.workers import SENDER_ENV, FleetActive

SILENT_S = 10.0
"""A worker whose process runs but whose reports (every 0.5 s) stopped this long ago, while
another worker's still come, is stuck (stopped, or its loop blocked): WORKER_DOWN says so,
and clears when it reports again. It is not killed: the kernel keeps handing it a share of
new connections, which wait, so the operator must see it."""
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
FIRST_DELAY_S = 0.5
READY_TIMEOUT_S = 30.0
FINAL_REPORT_S = 10.0
"""How long past the grace period a stopping worker has to finish: its last streams'
records and its final report to the coordinator; then it is killed."""


class StartupErrorProxy(RuntimeError):
    """A worker failed to start (mapped to StartupError by the coordinator)."""


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) a SO_REUSEPORT socket so every worker gets the same port
    even when the user asked for port 0.

    The port is first bound alone (no SO_REUSEPORT) and let go: a port another process
    listens on with SO_REUSEPORT — a second ``llmtop run --workers`` given the same
    ``--listen``, ``llmtop sim --reuse-port`` — is refused ("Address already in use"), as
    one process refuses it. Before, the workers joined it and the kernel split the clients
    between the two, half the traffic unseen by this proxy."""
    try:
        alone = _bound(host, port, reuse_port=False)
        port = alone.getsockname()[1]
        alone.close()
        return _bound(host, port, reuse_port=True)
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host  # as --listen takes it
        raise StartupErrorProxy(
            f"listen address {shown}:{port}: {exc.strerror or exc}") from None


def _bound(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    if is_any_v6(host):  # the workers' [::] is dual-stack (llmtop.listen)
        return dual_stack(port, reuse_port=reuse_port, listen=False)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
    except BaseException:
        s.close()
        raise
    return s


@dataclass(frozen=True)
class WorkerLauncher:
    """How to start worker ``i``: the same command line for a first start and a restart."""

    cfg: Config
    listen: str
    """``host:port`` with the port resolved (every worker binds the same one)."""
    ingest_url: str
    token: str
    config_path: str | None = None
    fleet_fd: int | None = None
    """The coordinator's descriptor of the shared table (:mod:`llmtop.fleet_counts`)."""
    senders: dict[int, str] = field(default_factory=dict, compare=False)
    """Per worker, the sender its current process posts as (:data:`~llmtop.workers.SENDER_ENV`,
    named here at each start): the supervisor retires a dead process by it even when no
    report of it was read yet."""

    async def start(self, index: int) -> asyncio.subprocess.Process:
        """Start worker ``index`` and wait until it listens (``StartupErrorProxy``,
        ``OSError``, ``TimeoutError``)."""
        cmd = [sys.executable, "-m", "llmtop", "_worker", "--index", str(index),
               "--listen", self.listen, "--upstream", self.cfg.upstream,
               "--ingest", self.ingest_url]
        if self.config_path:
            cmd += ["--config", self.config_path]
        if self.fleet_fd is not None:
            cmd += ["--fleet", f"/dev/fd/{self.fleet_fd}"]
        env = child_env()  # it stops if the coordinator dies
        env.update(clock_env())  # its times on the coordinator's timeline (llmtop.clock)
        # what the command line set, which the worker's own load of the file and the
        # environment would not see (the forwarded client of --trusted-proxies); without
        # it a file's value that a flag overrode failed the worker's checks (a keep = N in
        # the file with --rotate-s, a non-loopback admin with --admin-token)
        env.update(env_of(self.cfg, RUN_FLAGS))
        sender = secrets.token_hex(8)
        env[SENDER_ENV] = sender
        self.senders[index] = sender
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, env=env,
            pass_fds=() if self.fleet_fd is None else (self.fleet_fd,),
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(self.token.encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            await _stop(proc)
            raise StartupErrorProxy(
                f"worker {index} did not start: not listening after {READY_TIMEOUT_S:g} s "
                "(is the machine out of memory or CPU?)") from None
        except BaseException:
            _terminate(proc)
            raise
        if not line.startswith(b"llmtop: worker ready"):
            _terminate(proc)
            said = line.decode(errors="replace").strip()
            if not said:
                try:
                    code = await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    code = None
                said = (f"it exited with code {code} (its error is above)" if code is not None
                        else "it said nothing")
            raise StartupErrorProxy(f"worker {index} did not start: {said}")
        return proc


def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, and SIGCONT: a stopped process (SIGSTOP, a debugger) holds the SIGTERM
    until it runs again — before, a stopping coordinator waited its grace and
    :data:`FINAL_REPORT_S` more, then killed it, its open requests counted nowhere."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)


async def _stop(proc: asyncio.subprocess.Process, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaped either way (no zombie left)."""
    _terminate(proc)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def spawn_workers(cfg: Config, ingest_url: str, token: str, config_path: str | None,
                        fleet_fd: int | None = None,
                        ) -> tuple[list[asyncio.subprocess.Process], str, WorkerLauncher]:
    """Start ``cfg.workers`` proxy processes on one port; returns them, the proxy URL and
    the launcher that starts them again."""
    host, port = parse_hostport(cfg.listen, "listen")
    holder = reserve_port(host, port)
    port = holder.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    launcher = WorkerLauncher(cfg, f"{shown}:{port}", ingest_url, token, config_path, fleet_fd)
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i in range(cfg.workers):
            procs.append(await launcher.start(i))  # noqa: PERF401 (kept as they start: stopped on a failure)
    except BaseException:
        for p in procs:
            _terminate(p)
        raise
    finally:
        holder.close()
    return procs, f"http://{shown}:{port}", launcher


def describe_exit(returncode: int | None) -> str:
    """``exit code 3``, ``killed by SIGKILL``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


UNKNOWN_USER = "unknown"
"""The user of a request only the number of which is known (:func:`unreported_lost`)."""


def unreported_lost(worker: int, pid: int, k: int, how: str, *,
                    ended: bool = False) -> RequestRecord:
    """The record of a request worker ``worker`` (process ``pid``) had open when it exited
    (``how``) but had not reported yet: counted as failed (its client saw the connection
    close), its details unknown — the user ``unknown`` (as a client without an address is
    named; a blank one was a user row with no name, and ``user=""`` on /metrics, which
    Prometheus stores as no user label), no first token (so no TTFT sample: only an
    ``ok`` request gives an E2E one), status 502, and an error that says so (not an
    unreachable upstream). ``k`` numbers such records of one exit. ``ended``: a request it
    opened and ended after its last report (the shared table's running total of opened
    requests says how many), its record dead in the worker's buffer: counted as failed
    all the same — its client may have had its whole answer, but nothing of it is known
    (the exit line and ``EVENTS_LOST`` say so) — rather than missing from every count."""
    if ended:
        error = (f"{WORKER_EXIT_PREFIX}{worker} exited ({how}) before it reported this "
                 "request: it opened and ended after its last report and its record was lost "
                 "with the worker, so only its number is known (its outcome too is unknown)")
    else:
        error = (f"{WORKER_EXIT_PREFIX}{worker} exited ({how}) with the request open; it "
                 "opened after its last report, so only its number is known")
    return RequestRecord(
        id=f"w{worker}-lost-{pid}-{k}", user=UNKNOWN_USER, model=None, dialect="other", path="",
        stream=False, status=502, outcome="error", t_start=unix_now(), ttft_s=None,
        e2e_s=0.0, prompt_tokens=None, completion_tokens=None, token_source="chunks",
        error=error)


class Supervisor:
    """Watches the workers while the proxy runs and restarts one that exits (module
    docstring). ``procs[i]`` is always worker i's current process."""

    def __init__(self, launcher: WorkerLauncher, procs: list[asyncio.subprocess.Process],
                 counts: FleetCounts | None, active: FleetActive, say: Callable[[str], None],
                 *, publish: Callable[[Event], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 first_delay_s: float = FIRST_DELAY_S) -> None:
        self.launcher = launcher
        self.publish = publish
        """Where the ``WORKER_DOWN`` warning goes (the coordinator's bus: the live views,
        the recording and /metrics show it)."""
        self.down: dict[int, str] = {}
        """Workers not serving now, and why."""
        self.procs = procs
        self.counts = counts
        self.active = active
        self.say = say
        self.clock = clock
        self.first_delay_s = first_delay_s
        self.exits: dict[int, deque[float]] = {}
        self.restarts = 0
        """Workers started again since the proxy started."""
        self.given_up: set[int] = set()
        self.silent: set[int] = set()
        """Workers whose process runs but which stopped reporting (:data:`SILENT_S`)."""
        self._stopping = False

    async def run(self) -> None:
        """Until cancelled (:meth:`stop_all` cancels it). Each exit is cleaned up at once;
        restarts run beside (one slow to start delays no other worker's cleanup)."""
        pending: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(p.wait()): i for i, p in enumerate(self.procs)}
        restarts: set[asyncio.Future[Any]] = set()
        watch = asyncio.ensure_future(self._watch_reports())
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    if fut in restarts:
                        restarts.discard(fut)
                        proc = fut.result()
                        if proc is not None:
                            pending[asyncio.ensure_future(proc.wait())] = i
                        continue
                    delay = self._exited(i)
                    if delay is not None:
                        task = asyncio.ensure_future(self._restart(i, delay))
                        restarts.add(task)
                        pending[task] = i
        finally:
            watch.cancel()
            for fut in pending:
                fut.cancel()
            with contextlib.suppress(BaseException):  # a restart under way stops its child
                await asyncio.gather(watch, *pending, return_exceptions=True)

    async def _watch_reports(self, every_s: float = 1.0) -> None:
        """Once a second: :meth:`check_reports` (skipped after this loop itself was held up,
        when every report is late for the coordinator's reason, not the workers')."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(every_s)
            if loop.time() - before < every_s + 1.0:
                self.check_reports(time.monotonic())

    def check_reports(self, now: float) -> None:
        """Raise WORKER_DOWN for a running worker that stopped reporting while another
        still reports, or while no other reports at all (:data:`SILENT_S`; one worker:
        ``--split-observers``, or the others exited — before, such a worker was never
        named); clear it once it reports again."""
        heard = self.active.heard
        for i, proc in enumerate(self.procs):
            t = heard.get(i)
            if proc.returncode is not None or t is None or (i in self.down
                                                            and i not in self.silent):
                continue  # exited (its own path), or not reported yet since its start
            quiet = now - t
            others = [u for j, u in heard.items() if j != i]
            if quiet >= SILENT_S and i not in self.silent and (
                    not others or any(now - u < SILENT_S for u in others)):
                self.silent.add(i)
                self._down(i, f"worker {i} (pid {proc.pid}) has not reported for "
                           f"{quiet:.0f} s although it runs: stuck or stopped? the "
                           "connections the kernel hands it wait",
                           "; its figures are missing until it reports again")
            elif quiet < SILENT_S and i in self.silent:
                self.silent.discard(i)
                self.down.pop(i, None)
                self._warn("raised" if self.down else "cleared")
                self.say(f"llmtop: worker {i} reports again")

    def _exited(self, i: int) -> float | None:
        """Worker i is gone: clean up after it; the delay before its restart, or None."""
        if self._stopping:
            return None
        self.silent.discard(i)
        how = describe_exit(self.procs[i].returncode)
        lost, ended, unreported = self._count_lost(i, how)
        tries = self._tried(i)
        if tries > MAX_RESTARTS:
            self.given_up.add(i)
            self._down(i, f"worker {i} exited ({how}) {tries} times in "
                       f"{RESTART_WINDOW_S:.0f} s: not restarted", "; the other workers go on")
            return None
        delay = self.first_delay_s * (1 << (tries - 1))
        said = ("" if not lost else
                f"; its {lost} open request{' was' if lost == 1 else 's were'} lost")
        if ended:
            said += (f"; {ended} request{'' if ended == 1 else 's'} its last report had "
                     f"open ended since, {'its record' if ended == 1 else 'their records'}"
                     " lost with it (counted as errors)")
        if unreported:
            one = unreported == 1
            said += (f"; {unreported} request{'' if one else 's'} it opened and ended after "
                     f"its last report, {'its record' if one else 'their records'} lost "
                     "with it (counted as errors; EVENTS_LOST)")
        self._down(i, f"worker {i} exited ({how}); restarting it", f" in {delay:g} s{said}")
        return delay

    def _count_lost(self, i: int, how: str) -> tuple[int, int, int]:
        """Worker i's process is gone (``how``): the others stop counting its requests, the
        screens stop showing them, and each one it had open is counted as failed. Returned:
        how many it had open at its exit (the shared table's exact count, else its last
        report's), and how many its last report had open that had ended since (the table
        counted fewer: their records died in its buffer; counted as failed all the same,
        so that the totals keep them — the exit line used to call them open and lost), and
        how many it opened and ended after its last report (the table's running total of
        requests opened, less the records the coordinator took from it and its last
        report's open ones, less those open at the exit: their records died in its buffer;
        counted as failed too — before, six requests served in the half second before a
        SIGKILL read as one request and no error). Both kinds that ended are records that
        never reached the coordinator: added to ``EVENTS_LOST``."""
        open_at_exit = opened = 0
        if self.counts is not None:
            open_at_exit = self.counts.count(i)  # exact: the worker wrote it as each opened
            opened = self.counts.opened(i)
            self.counts.clear(i)  # the others no longer count its requests (and its next
            # process counts its opened ones from 0)
        # nor do the screens show them; and what no report of it carried
        # (by the sender its launcher named, known even when no report of it was read: its
        # first POST, read after its death, then counts nothing twice)
        sender = getattr(self.launcher, "senders", {}).get(i)
        lost, unreported = self.active.retire(i, opened, sender)
        unreported_open = max(0, open_at_exit - len(lost))
        ended_unreported = max(0, unreported - unreported_open)
        if self.publish is not None:  # their clients saw them fail: count them
            now_ns = time.perf_counter_ns()  # the workers' clock too (CLOCK_MONOTONIC)
            for a in lost:
                self.publish(a.lost(now_ns, f"{WORKER_EXIT_PREFIX}{i} exited ({how}) "
                                            "with the request open"))
            # those it opened after its last report (every 0.5 s): only their number is
            # known, from the shared table; without these, a worker killed just after a
            # burst lost its requests from every count (QA: 20 of 40 streams cut, and
            # the proxy said 20 served, 0 errors)
            pid = self.procs[i].pid
            for k in range(unreported_open):
                self.publish(unreported_lost(i, pid, k, how))
            # those it opened and ended after its last report: their records died in its
            # buffer (the shared table's running total says how many)
            for k in range(unreported_open, unreported_open + ended_unreported):
                self.publish(unreported_lost(i, pid, k, how, ended=True))
        if self.counts is None:
            return len(lost), 0, 0
        ended = max(0, len(lost) - open_at_exit)
        if self.active.lost_events is not None:  # both kinds of ended: records never sent
            self.active.lost_events.killed(i, ended + ended_unreported)
        return open_at_exit, ended, ended_unreported

    def _tried(self, i: int) -> int:
        """Worker i exited or failed to start again: how many times in the last
        :data:`RESTART_WINDOW_S` (both count towards :data:`MAX_RESTARTS`)."""
        now = self.clock()
        recent = self.exits.setdefault(i, deque())
        recent.append(now)
        while recent and recent[0] < now - RESTART_WINDOW_S:
            recent.popleft()
        return len(recent)

    async def _restart(self, i: int, delay: float) -> asyncio.subprocess.Process | None:
        """Worker i's new process after ``delay``, or None. A start that fails (its port
        taken for a moment, a start-up slower than the wait on a loaded machine) is tried
        again, with the backoff of a worker that keeps exiting, and given up after as
        many tries (before, one failed start left the worker stopped for good)."""
        while True:
            await asyncio.sleep(delay)
            if self._stopping:  # stop_all came during the wait
                return None
            try:
                proc = await self.launcher.start(i)
            except (StartupErrorProxy, OSError, TimeoutError) as exc:
                tries = self._tried(i)
                if tries > MAX_RESTARTS:
                    self.given_up.add(i)
                    self._down(i, f"worker {i} could not be restarted: {exc} ({tries} exits "
                               f"and failed starts in {RESTART_WINDOW_S:.0f} s): not "
                               "restarted", "; the other workers go on")
                    return None
                delay = self.first_delay_s * (1 << (tries - 1))
                self._down(i, f"worker {i} could not be restarted: {exc}",
                           f"; trying again in {delay:g} s")
                continue
            self.procs[i] = proc
            self.restarts += 1
            self._up(i)
            return proc

    def _down(self, i: int, why: str, more: str = "") -> None:
        """Worker i is not serving: the warning carries ``why``; the coordinator's output
        ``why`` and ``more``."""
        self.down[i] = why
        self._warn("raised")
        self.say(f"llmtop: {why}{more}")

    def _up(self, i: int) -> None:
        self.down.pop(i, None)
        self._warn("raised" if self.down else "cleared")
        self.say(f"llmtop: worker {i} restarted")

    def _warn(self, state: Literal["raised", "cleared"]) -> None:
        if self.publish is None:
            return
        n = len(self.procs)
        serving = n - len(self.down)
        msg = (f"{serving} of {n} workers serving: " + "; ".join(
            self.down[i] for i in sorted(self.down)) + " (the coordinator's output has "
               "the details; a worker's open requests are lost when it exits)"
               if self.down else f"all {n} workers serving again")
        self.publish(WarningEvent(unix_now(), "WORKER_DOWN", "critical", msg, state))

    def hurry(self, say: Callable[[str], None]) -> None:
        """A second signal while stopping: tell every worker, which then cancels what is
        still in flight at once."""
        say("llmtop: stopping now: the requests still in flight are cancelled")
        for p in self.procs:
            if p.returncode is None:
                _terminate(p)

    async def stop_all(self, task: asyncio.Task[None] | None, grace_s: float) -> None:
        """Stop watching (``task``: :meth:`run`'s), then stop every worker gracefully."""
        self._stopping = True
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await stop_workers(self.procs, grace_s)
        for i, p in enumerate(self.procs):  # one killed at the deadline had requests open
            self._count_lost(i, describe_exit(p.returncode))  # (one that stopped: none)


async def stop_workers(procs: list[asyncio.subprocess.Process], grace_s: float) -> None:
    for p in procs:
        if p.returncode is None:
            _terminate(p)
    deadline = time.monotonic() + grace_s + FINAL_REPORT_S
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
