"""Run a benchmark plan: levels (or a search), progress, table, verdict, JSON, recording.

How a run ends: normally (exit 0); with nothing succeeded at all — a dead or rejecting
target — as one error line (exit 1); when the target stops answering mid-run (no HTTP
answer at all in a level after earlier successes) with the finished levels and the reason
(exit 1); on Ctrl-C with the finished levels, a note of the level it interrupted and the
recording closed with every request done so far (exit 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

import aiohttp

from llmtop import __version__
from llmtop.bench.client import Api, BenchClient
from llmtop.bench.gpu_level import collect, over_level
from llmtop.bench.loadgen import StepInterrupted, StepRun, run_closed, run_open
from llmtop.bench.output import (
    error_lines,
    gpu_lines,
    lag_text,
    level_label,
    overflow_text,
    table,
    verdict,
)
from llmtop.bench.search import SearchResult, not_counted, passes, search
from llmtop.bench.summary import StepSummary, errors_text, summarize
from llmtop.bench.workload import Workload
from llmtop.config import Config, slo_dict
from llmtop.events import RequestRecord
from llmtop.net_errors import OUT_OF_FILES, connect_failure
from llmtop.out_of_files import open_files_limit
from llmtop.stop_signals import stop_signals

if TYPE_CHECKING:
    from llmtop.gpu.start import GpuSourceHandle


@dataclass
class BenchPlan:
    url: str
    mode: Literal["concurrency", "rate"]
    levels: list[float]
    search: bool
    duration_s: float | None
    requests: int | None
    warmup_s: float
    workload: Workload
    api: Api = "chat"
    model: str = "default"
    ignore_eos: bool = True
    poisson: bool = True
    seed: int = 0
    max_level: float = 1024
    timeout_s: float = 600.0
    admin_url: str | None = None
    admin_headers: dict[str, str] = field(default_factory=dict, repr=False)
    """What ``admin_url`` is asked with: its token (``$LLMTOP_ADMIN_TOKEN``), never shown."""
    record: str | None = None
    as_json: bool = False
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra request headers (``--header``, ``--api-key``): sent, never recorded or shown."""


def _n(count: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class BenchStepLine:
    """A recording line (``type: bench_step``) with one level's summary."""

    def __init__(self, s: StepSummary) -> None:
        self.s = s

    def to_json_dict(self) -> dict[str, Any]:
        d = self.s.to_json_dict()
        d.pop("histograms", None)
        return {"type": "bench_step", "t": time.time(), **d}


class Progress:
    """One status line on stderr, rewritten in place on a terminal."""

    def __init__(self, out: TextIO | None = None) -> None:
        # (stderr as it is now, not as it was at import: pytest's capture swaps it per test)
        self.out = out = sys.stderr if out is None else out
        self.tty = out.isatty()
        self.label = ""
        self._draining = False
        self._last = 0.0
        self._open = False

    def step(self, label: str) -> None:
        self.label = label
        self._draining = False
        self._write(f"{label}: starting")

    def update(self, run: StepRun) -> None:
        if run.draining and not self._draining:  # said at once: the wait can be long
            self._draining = True
            n = run.draining
            self._write(f"{self.label}: all arrivals sent; waiting for the {n} request"
                        f"{'' if n == 1 else 's'} still open (each until it ends or "
                        "times out)")
            return
        now = time.monotonic()
        if now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        ttfts = sorted(r.ttft_s for r in run.records[-200:] if r.ttft_s is not None)
        p95 = ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else None
        shown = "n/a" if p95 is None else f"{p95 * 1000:.0f} ms"
        n = len(run.records)
        self._write(f"{self.label}: {n} request{'' if n == 1 else 's'} done, "
                    f"TTFT p95 ≈ {shown}")

    def done(self, s: StepSummary) -> None:
        att = "n/a" if s.slo_attainment is None else f"{s.slo_attainment:.0%}"
        errors = f", errors: {errors_text(s.error_kinds)}" if s.error_kinds else ""
        gave_up = " (gave up: nothing succeeded)" if s.gave_up else ""
        dropped = f", {overflow_text(s.overflow)}" if s.overflow else ""
        late = (f", sent late (P99 {s.send_lag_p99_s * 1000:.0f} ms behind schedule)"
                if lag_text(s) is not None and s.send_lag_p99_s is not None else "")
        self._write(f"{self.label}: {_n(s.requests, 'request')}, {s.output_tps:.0f} tok/s, "
                    f"SLO attainment {att}{errors}{dropped}{late}{gave_up}", end=True)

    def end_line(self) -> None:
        """End a line left open on a terminal (before other output)."""
        if self._open:
            self._open = False
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.out.write("\n")
                self.out.flush()

    def _write(self, text: str, end: bool = False) -> None:
        try:
            if self.tty:
                self.out.write("\r\x1b[2K" + text + ("\n" if end else ""))
                self._open = not end
            else:
                self.out.write(text + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):  # stderr closed or piped to a closed reader
            pass


async def _gpu_readings(session: aiohttp.ClientSession, admin: str,
                        headers: dict[str, str]) -> list[dict[str, Any]]:
    try:
        async with session.get(admin.rstrip("/") + "/llmtop/v1/snapshot?window=10",
                               headers=headers) as r:
            snap = await r.json()
            gpus = snap.get("gpus") or []
            return [g for g in gpus if isinstance(g, dict)]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []


async def _stop(task: asyncio.Task[None] | None) -> None:
    """Stop a level's GPU sampling (:func:`gpu_level.collect`). (``asyncio.wait``, not
    ``await task`` under a suppressed CancelledError: a Ctrl-C cancelling this task
    meanwhile must not be swallowed with the sampler's own.)"""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task])


async def through_cancels(aw: Awaitable[None]) -> None:
    """Await ``aw`` to its end even when this task is cancelled meanwhile (a Ctrl-C in the
    milliseconds while the GPU source stops: its thread is joined through ``to_thread``,
    and the cancel raised CancelledError out of :func:`execute`, a traceback instead of
    the results). The cancel is taken back: the run had ended already."""
    inner = asyncio.ensure_future(aw)
    task = asyncio.current_task()
    while not inner.done():
        try:
            await asyncio.wait([inner])
        except asyncio.CancelledError:
            if task is not None:
                task.uncancel()
    inner.result()


async def admin_problem(admin: str, headers: dict[str, str] | None = None) -> str | None:
    """Why ``admin`` gives no GPU readings (it does not answer, or not as an llmtop admin
    API, or refuses the token), or ``None`` when it does: ``--admin`` is checked before any
    load is sent, as :func:`_gpu_readings` later says nothing."""
    url = admin.rstrip("/") + "/llmtop/v1/snapshot?window=10"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as sess, \
                sess.get(url, headers=headers) as r:
            if r.status in (401, 403):
                return (f"HTTP {r.status} from {url}: the admin token was refused"
                        if headers else f"HTTP {r.status} from {url}: it wants a token "
                        "(set LLMTOP_ADMIN_TOKEN)")
            if r.status != 200:
                return f"HTTP {r.status} from {url}"
            snap = await r.json(content_type=None)
    except aiohttp.ClientConnectorError as exc:
        return f"{connect_failure(exc)} at {admin}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"no answer from {admin} ({type(exc).__name__})"
    except ValueError:
        snap = None
    if not isinstance(snap, dict) or "gpus" not in snap:
        return f"{url} is not an llmtop snapshot"
    return None


class _Stop(Exception):
    """Ends the run early: ``nothing_ok`` when no request has succeeded at all."""

    def __init__(self, message: str, nothing_ok: bool) -> None:
        super().__init__(message)
        self.nothing_ok = nothing_ok


@dataclass
class BenchOutcome:
    """What a run did: its finished levels, and whether and why it ended early."""

    result: SearchResult
    interrupted: str | None = None
    """The level Ctrl-C interrupted (``concurrency 4``), or ``between levels``."""
    interrupted_level: float | None = None
    """The value of the level Ctrl-C interrupted (None: between levels, or none)."""
    interrupted_done: int = 0
    """Requests of the interrupted level that had finished by then."""
    interrupted_stopped: int = 0
    """Requests of the interrupted level that were open, stopped (and recorded as such)."""
    stopped: str | None = None
    """Why the run ended early (a runtime failure: exit 1)."""
    nothing_ok: bool = False
    """No request succeeded at all: the one-line error is the whole answer."""
    terminated: int = 0
    """The signal, not Ctrl-C, that interrupted the run: SIGTERM, or SIGHUP (the ssh
    session closed); handled the same, exit 128 + it (143, 129)."""
    steps: list[StepSummary] = field(default_factory=list)


async def execute(plan: BenchPlan, cfg: Config, progress: Progress,
                  sink: list[RequestRecord], recorder: Any,
                  outcome: BenchOutcome | None = None) -> BenchOutcome:
    """Run the plan's levels (or search), filling ``outcome`` (a new one by default) as
    they finish. Never raises for Ctrl-C, a dead target or a rejecting one: the outcome
    says how the run ended."""
    client = BenchClient(plan.url, api=plan.api, model=plan.model, timeout_s=plan.timeout_s,
                         connect_timeout_s=cfg.timeouts.connect_s,
                         ignore_eos=plan.ignore_eos, headers=dict(plan.headers))
    integer = plan.mode == "concurrency"
    outcome = BenchOutcome(SearchResult([], None, None)) if outcome is None else outcome
    steps = outcome.steps
    any_ok = False
    gpu: GpuSourceHandle | None = None

    def keep(records: list[RequestRecord]) -> None:
        sink.extend(records)
        if recorder is not None:
            recorder.on_events(records)

    async def read_gpus() -> list[dict[str, Any]]:
        if plan.admin_url:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as sess:
                return await _gpu_readings(sess, plan.admin_url, plan.admin_headers)
        return [r.to_json_dict() for r in gpu.latest()] if gpu is not None else []

    async def run_level(level: float) -> StepSummary:
        nonlocal any_ok
        label = level_label(plan.mode, level)
        progress.step(label)
        readings: list[dict[str, Any]] = []  # (the level's, as it runs: gpu_level)
        sampling = (asyncio.create_task(collect(read_gpus, readings))
                    if plan.admin_url or gpu is not None else None)
        try:
            if integer:
                run = await run_closed(client, plan.workload, int(level),
                                       duration_s=plan.duration_s, requests=plan.requests,
                                       warmup_s=plan.warmup_s, progress=progress.update)
            else:
                run = await run_open(client, plan.workload, level, duration_s=plan.duration_s,
                                     requests=plan.requests, warmup_s=plan.warmup_s,
                                     poisson=plan.poisson, seed=plan.seed + len(steps),
                                     progress=progress.update)
        except StepInterrupted as exc:  # Ctrl-C: keep (and record) what the level did
            await _stop(sampling)
            keep(exc.run.records)
            outcome.interrupted, outcome.interrupted_level = label, level
            outcome.interrupted_done = sum(r.outcome != "cancelled" for r in exc.run.records)
            outcome.interrupted_stopped = len(exc.run.records) - outcome.interrupted_done
            raise
        finally:
            await _stop(sampling)
        s = summarize(run, cfg)
        keep(run.records)
        own = s.error_kinds.get(OUT_OF_FILES, 0)
        if own:  # this process's limit: the level's figures would not be the target's
            raise _Stop(f"{label}: llmtop bench ran out of file descriptors "
                        f"({open_files_limit()}): {own} of its {s.requests} requests were "
                        "never sent, so the level measures this process, not the target "
                        "(left out of the results); raise the limit (ulimit -n) or lower "
                        "the level", nothing_ok=False)
        try:  # the level is done: a Ctrl-C while its readings come keeps it (without them)
            s.gpus = over_level(readings, run.started, run.ended)
            if not s.gpus and (plan.admin_url or gpu is not None):
                # a level too short for a reading inside it: the one at its end
                s.gpus = [{**g, "samples": 1} for g in await read_gpus()]
        finally:
            if recorder is not None:
                recorder.on_events([BenchStepLine(s)])
            steps.append(s)
            progress.done(s)
        any_ok = any_ok or run.watch.any_ok
        _check_alive(run, label, any_ok, client.url())
        return s

    loop, main = asyncio.get_running_loop(), asyncio.current_task()

    # SIGTERM (timeout(1), a job scheduler) and SIGHUP (the ssh session closed; not
    # under nohup) end the run as Ctrl-C: the finished levels said, the record complete
    terms = [sig for sig in stop_signals() if sig != signal.SIGINT]

    def on_term(sig: signal.Signals) -> None:
        outcome.terminated = int(sig)
        for s in terms:
            loop.remove_signal_handler(s)  # a second one kills
        if main is not None:
            main.cancel()

    # Ctrl-C, handled on the loop too: asyncio.run's own handler raises KeyboardInterrupt
    # at a second Ctrl-C wherever the loop is, which can drop a task's wake-up mid-stop:
    # bench then hung for good in asyncio.run's clean-up (seen 3 times in 10 with two
    # SIGINTs back to back). A second Ctrl-C while the level stops (milliseconds) is
    # taken as the first; a third ends the process at once.
    presses = 0

    def on_int() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            if main is not None:
                main.cancel()
        elif presses == 2:
            with contextlib.suppress(OSError, ValueError):
                print("llmtop bench: stopping (Ctrl-C again quits at once, without the "
                      "results)", file=sys.stderr)
        else:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    # (no handler where the loop cannot have one: Windows, or a thread other than main;
    # SIGTERM then does what it did before: end the process)
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        for sig in terms:
            loop.add_signal_handler(sig, on_term, sig)
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:  # (kept ignored, as inherited)
            loop.add_signal_handler(signal.SIGINT, on_int)
    try:
        if not plan.admin_url:  # local GPUs through NVML, when there are any
            from llmtop.gpu import open_gpu_source

            gpu = open_gpu_source(cfg, lambda ev: None, upstream=plan.url)
            if gpu.start() and gpu.kind == "none":
                gpu = None
        if plan.search:
            outcome.result = await search(run_level, integer=integer,
                                          start_levels=plan.levels, target=cfg.slo.target,
                                          max_level=plan.max_level)
            return outcome
        for level in plan.levels:
            await run_level(level)
    except _Stop as exc:
        outcome.stopped, outcome.nothing_ok = str(exc), exc.nothing_ok
    except asyncio.CancelledError:  # Ctrl-C or SIGTERM cancelled us; end normally
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if outcome.interrupted is None:
            outcome.interrupted = "between levels"
    finally:
        try:
            if gpu is not None:
                await through_cancels(gpu.stop())
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                for handled in [*terms, signal.SIGINT]:
                    loop.remove_signal_handler(handled)
    outcome.result = _settled(steps, cfg.slo.target)
    return outcome


def _settled(steps: list[StepSummary], target: float) -> SearchResult:
    """The finished levels, the best and the lowest failed one."""
    fail = [s for s in steps if not passes(s, target) and not not_counted(s, target)]
    first_fail = min(fail, key=lambda s: s.level) if fail else None
    # the largest passing level below every failing one: a level that passed above a
    # failed one (noise, a hiccup) is not a capacity to plan on (the verdict says so)
    ok = [s for s in steps if passes(s, target)
          and (first_fail is None or s.level < first_fail.level)]
    best = max(ok, key=lambda s: s.level) if ok else None
    return SearchResult(list(steps), best, first_fail)


def _check_alive(run: StepRun, label: str, any_ok: bool, url: str) -> None:
    """Raise :class:`_Stop` when going on is pointless: nothing has succeeded at all, or the
    target stopped answering (no HTTP answer in a whole level after earlier successes)."""
    if not run.watch.any_ok and not run.watch.kinds and run.cut_off \
            and not run.cut_off_answered:  # no request finished, and none had an answer
        n = run.cut_off
        silent = (f"{label}: none of its {n} open request{'' if n == 1 else 's'} had an "
                  "answer when the level ended")
        if not any_ok:
            raise _Stop(f"no request to {url} succeeded ({silent})", nothing_ok=True)
        raise _Stop(f"the target stopped answering ({silent}); stopped there",
                    nothing_ok=False)
    if run.watch.any_ok or not run.watch.kinds:
        return  # something worked, or nothing failed (no request finished)
    kinds = f"{label}: {errors_text(run.watch.kinds)}"
    last = run.watch.last_error
    if last and last.startswith(("HTTP ", "stream error")) and ": " in last:
        kinds += f"; last: {' '.join(last.split())[:200]}"  # the server's own words
    if not any_ok:
        raise _Stop(f"no request to {url} succeeded ({kinds})", nothing_ok=True)
    if run.watch.answered == 0:
        raise _Stop(f"the target stopped answering ({kinds}); stopped there",
                    nothing_ok=False)


def _header(plan: BenchPlan, cfg: Config) -> dict[str, Any]:
    if plan.mode == "concurrency":
        arrivals = "closed-loop"  # each worker sends its next request when one ends
    else:
        arrivals = "poisson" if plan.poisson else "constant"
    bench: dict[str, Any] = {
        "mode": plan.mode, "levels": plan.levels, "search": plan.search,
        "duration_s": plan.duration_s, "requests": plan.requests,
        "warmup_s": plan.warmup_s, "workload": plan.workload.describe(),
        "arrivals": arrivals, "api": plan.api,
    }
    if plan.search:
        bench["max_level"] = plan.max_level
    return {"upstream": plan.url, "slo": slo_dict(cfg), "llmtop_version": __version__,
            "source": "bench", "bench": bench}


def run_plan(plan: BenchPlan, cfg: Config, out: TextIO | None = None) -> int:
    """Run the plan, print its results; the exit code (0, 1 failed run, 130 Ctrl-C, 143
    SIGTERM, 129 SIGHUP)."""
    out = out or sys.stdout
    progress = Progress()
    records: list[RequestRecord] = []
    recorder = None
    if plan.record:
        from llmtop.recording.writer import Recorder

        recorder = Recorder(plan.record, header=_header(plan, cfg))
        recorder.start()
    # filled as levels finish, so that what finished is still printed when a Ctrl-C
    # lands outside execute's own handler (asyncio.run's clean-up, before the handler is
    # installed): asyncio.run then raises KeyboardInterrupt, and returns nothing
    outcome = BenchOutcome(SearchResult([], None, None))
    record_failed = False
    try:
        asyncio.run(execute(plan, cfg, progress, records, recorder, outcome))
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside the event loop
        outcome.interrupted = outcome.interrupted or "between levels"
        outcome.result = _settled(outcome.steps, cfg.slo.target)
    finally:
        progress.end_line()
        if recorder is not None:
            done = recorder.stop()
            record_failed = bool(done.get("error"))
            print(f"llmtop bench: recorded {_n(done.get('requests', 0), 'request')} to "
                  f"{plan.record}"
                  + (f"; the recording failed ({done['error']}): the file holds only part "
                     "of the run"
                     if record_failed else ""), file=sys.stderr)
    if outcome.nothing_ok:
        if plan.as_json:  # a script still gets its document: what failed, and how often
            with contextlib.suppress(BrokenPipeError):
                _print_results(plan, cfg, outcome, out)
        print(f"llmtop bench: error: {outcome.stopped}", file=sys.stderr)
        return 1
    code = (128 + outcome.terminated if outcome.terminated else 130) if outcome.interrupted else \
        1 if outcome.stopped or record_failed else 0
    try:
        _print_results(plan, cfg, outcome, out)
    except BrokenPipeError:  # `llmtop bench … | head`: the reader has what it wanted
        _quiet_stdout(out)
        return code
    if outcome.interrupted:
        n = len(outcome.result.steps)
        where = ("between levels" if outcome.interrupted == "between levels" else
                 f"during {outcome.interrupted} ({outcome.interrupted_done} of its requests "
                 f"done, {outcome.interrupted_stopped} stopped)")
        finished = (f"results above for the {n} level{'s' if n != 1 else ''} that finished"
                    if n else "no level had finished")
        print(f"llmtop bench: interrupted {where}; {_n(len(records), 'request')} in all; "
              f"{finished}", file=sys.stderr)
    elif outcome.stopped:
        print(f"llmtop bench: error: {outcome.stopped}", file=sys.stderr)
    return code


def _print_results(plan: BenchPlan, cfg: Config, outcome: BenchOutcome, out: TextIO) -> None:
    result = outcome.result
    shown = verdict(result, plan.mode, cfg, outcome.interrupted, outcome.interrupted_level)
    if plan.as_json:
        json.dump({
            "mode": plan.mode, "slo": slo_dict(cfg), "workload": plan.workload.describe(),
            "steps": [s.to_json_dict() for s in result.ordered()],
            "best": None if result.best is None else result.best.level,
            "verdict": shown,
            "interrupted": outcome.interrupted,
            "stopped": outcome.stopped,
        }, out, indent=2)
        out.write("\n")
    elif result.steps:
        lines = [*table(result, plan.mode), *error_lines(result, plan.mode),
                 *gpu_lines(result, plan.mode), shown]
        out.write("\n".join(lines) + "\n")
    out.flush()


def _quiet_stdout(out: TextIO) -> None:
    """After a broken pipe: point stdout at /dev/null so the exit flush stays silent."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
