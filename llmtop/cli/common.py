"""Shared pieces of the command line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from llmtop.config import MAX_DURATION_S, RUN_FLAGS, Config, load_config, split_list
from llmtop.parent_watch import child_env
from llmtop.stop_signals import hangup_ignored

if TYPE_CHECKING:
    from llmtop.recording.parts import Source


class UsageError(ValueError):
    """A user mistake: printed as one line, exit code 2."""


class RuntimeFailure(RuntimeError):
    """A failure that is not the user's mistake (the disk filled while an output was
    written): printed as one line, exit code 1 (interfaces.md: "1 runtime failure")."""


DISK_FAILURES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""Write errors of the disk itself, not of the path the user named."""


def write_failed(message: str, exc: OSError) -> UsageError | RuntimeFailure:
    """The error to raise for an output that could not be written: a runtime failure when
    the disk failed (full, over quota, over the file size limit, an I/O error), else a usage
    error (a path that cannot be written: no such directory, permission denied)."""
    return RuntimeFailure(message) if exc.errno in DISK_FAILURES else UsageError(message)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``run`` that set config keys."""
    p.add_argument("--config", metavar="FILE", help="TOML config file (see config.example.toml)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="proxy address (default 127.0.0.1:8080; :PORT keeps the host, port 0 "
                        "picks a free one)")
    p.add_argument(
        "--admin", metavar="HOST:PORT",
        help="admin API address (default 127.0.0.1:8081, with or without the TUI; admin in "
             "--config or LLMTOP_ADMIN sets it too)"
    )
    p.add_argument("--admin-token", metavar="TOKEN", help="required when --admin is not loopback")
    p.add_argument("--upstream-ca", metavar="PEM",
                   help="CA certificates to trust for an https upstream (a private CA or a "
                        "self-signed certificate; default: the system's store)")
    p.add_argument("--record", metavar="FILE", help="record the session (.jsonl or .jsonl.gz)")
    p.add_argument("--rotate-mb", type=float, metavar="MB",
                   help="rotate the recording: close a part once its file reaches MB "
                        "megabytes (10^6 bytes as written, 0.01 to 1,000,000) and go on in "
                        "the next; the --record path is then the parts' stem (default "
                        "recording.rotate_mb: 0, off)")
    p.add_argument("--rotate-s", type=float, metavar="S",
                   help="...or once a part has been open S seconds (1 to 86400, e.g. 3600: "
                        "hourly), whichever comes first (default recording.rotate_s: 0, off)")
    p.add_argument("--keep", type=int, metavar="N",
                   help="with --rotate-mb or --rotate-s, keep the newest N parts of the "
                        "stem, deleting the oldest (the parts an earlier run with the same "
                        "--record left count too) (default recording.keep: 0, every part)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="proxy processes sharing the port (default 1; at most 2 per CPU; 4 "
                        "on one CPU)")
    p.add_argument("--split-observers", action="store_true", default=None,
                   help="metrics, warnings, recording and the admin API in a process of "
                        "their own, even with one worker (as --workers N > 1 always does): "
                        "shorter chunk-delay tails at hundreds of streams, for a few %% "
                        "more CPU; needs a core to spare")
    p.add_argument("--trusted-proxies", metavar="LIST",
                   help="the load balancers in front of llmtop, comma-separated addresses or "
                        "CIDR networks, e.g. 10.0.0.0/8,::1: a request from one is the user "
                        "its Forwarded / X-Forwarded-For / X-Real-IP names; '' trusts none "
                        "(default trusted_proxies: none, the connection's address)")
    p.add_argument("--gpus", metavar="LIST", help="GPU indices to sample, e.g. 0,1 (default all)")
    p.add_argument(
        "--gpu-source", choices=("auto", "nvml", "sim", "none"),
        help="where GPU readings come from (default auto: NVML when it initialises, else "
             "none; sim: llmtop sim's simulated GPU)"
    )
    add_slo_spec_argument(p, "(default: the --slo-* defaults)")
    p.add_argument("--slo-ttft", type=float, metavar="S", help="TTFT SLO in seconds (0.5)")
    p.add_argument("--slo-itl-p95", type=float, metavar="S",
                   help="per-request ITL p95 SLO in seconds (0.05)")
    p.add_argument("--slo-tpot", type=float, metavar="S", help="TPOT SLO in seconds (none)")
    p.add_argument("--slo-e2e", type=float, metavar="S", help="end-to-end SLO in seconds (none)")
    p.add_argument("--slo-target", type=float, metavar="F",
                   help="attainment target: the share of requests that must meet every SLO "
                        "(0.95)")


SLO_SPEC_KEYS: dict[str, str] = {
    "ttft": "ttft_s", "itl_p95": "itl_p95_s", "itl": "itl_p95_s", "tpot": "tpot_s",
    "e2e": "e2e_s", "target": "target",
}
"""``--slo`` keys → :class:`llmtop.config.SloConfig` fields (``itl`` is ``itl_p95``)."""
SLO_FLAGS: dict[str, str] = {
    "ttft_s": "--slo-ttft", "itl_p95_s": "--slo-itl-p95", "tpot_s": "--slo-tpot",
    "e2e_s": "--slo-e2e", "target": "--slo-target",
}
"""SloConfig fields → the single-SLO flags that set them."""
MAX_SLO_S = MAX_DURATION_S
"""The longest time an ``--slo`` spec accepts (a day, as every duration in the config)."""
_SLO_NAMES = {"ttft_s": "ttft", "itl_p95_s": "itl_p95", "tpot_s": "tpot", "e2e_s": "e2e",
              "target": "target"}


def add_slo_spec_argument(p: argparse.ArgumentParser, default: str) -> None:
    """``--slo KEY=VALUE,...`` (repeatable); ``default`` ends its help, e.g. ``(default: …)``."""
    p.add_argument("--slo", action="append", metavar="KEY=V,...",
                   help="SLOs in one flag, e.g. ttft=0.5,itl_p95=0.05,target=0.95; keys: ttft, "
                        "itl_p95 (or itl), tpot, e2e in seconds, target a share in (0, 1]; "
                        "repeatable; the same as the --slo-* flags, which it must not "
                        f"contradict {default}")


def add_series_argument(p: argparse.ArgumentParser) -> None:
    """``--series N``: which run of a rotated recording its stem reads (1 = the oldest)."""
    p.add_argument("--series", type=int, metavar="N",
                   help="a rotated recording given by its stem reads its newest series of "
                        "parts (a proxy restarted with the same --record starts a new one); "
                        "N reads the N-th instead, 1 = the oldest")


def check_recording_args(given: Mapping[str, str | None], *, stdin: bool = True) -> None:
    """A :class:`UsageError` for a recording argument (``{"FILE": args.file, ...}``, None:
    not given) that is empty — an unset shell variable, which read as '.' (".: is a
    directory") or, as FILE2, as no second file at all — and for ``-`` twice: standard
    input is read once (``stdin``: whether the command takes ``-``)."""
    for name, value in given.items():
        if value is not None and not value.strip():
            raise UsageError(f"{name} '{value}' is empty: give a recording (.jsonl or "
                             f".jsonl.gz){', or - for standard input' if stdin else ''}")
    if stdin and (dashes := [name for name, value in given.items() if value == "-"])[1:]:
        raise UsageError(f"{' and '.join(dashes)} are both - (standard input): it can be "
                         "read once; give one of them as a file")


def resolve_recording(path: str, series: int | None, label: str, *,
                      quiet: bool = False) -> Source:
    """``path`` as the recording commands read it (:func:`llmtop.recording.parts.resolve`:
    a file itself, a rotated recording's stem its series of parts), what the reader should
    know of it told on stderr (one line each, not with ``quiet``: a series' notes, a file
    with parts named after it too); a
    :class:`UsageError` when it is neither."""
    from llmtop.recording.errors import RecordingError
    from llmtop.recording.parts import Series, file_note, resolve

    if series is not None and series < 1:
        raise UsageError(f"--series must be 1 or more, got {series}")
    try:
        src = resolve(path, series=series)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    if not quiet:
        notes = src.notes if isinstance(src, Series) else [file_note(src)]
        for note in notes:
            if note:
                print(f"{label}: {note}", file=sys.stderr, flush=True)
    return src


def probe_new_file(path: str) -> None:
    """A :class:`UsageError` (a :class:`RuntimeFailure` for a disk error) when no file can
    be created in ``path``'s directory, found by making and removing a temporary one
    there: a directory writable by its mode may take no new file (/proc for root, a
    read-only mount), which a look at its mode cannot tell before a process binds its
    ports or starts its children. Nothing is said of a directory that does not exist or
    that its mode forbids, or of a path that is a directory: the recorder's own checks
    word those."""
    import tempfile

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir() or p.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return
    try:
        fd, name = tempfile.mkstemp(prefix=".llmtop-probe-", dir=parent)
    except OSError as exc:
        raise write_failed(f"{path}: cannot create a file there ({exc.strerror or exc})",
                           exc) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def refuse_stem_as_output(outputs: Iterable[str | Path], sources: Iterable[Source]) -> None:
    """A :class:`UsageError` when an output is the stem of a rotated recording being read
    (no file: the name its parts are named after), which the check against the input
    files cannot see: written there, the stem would read that file from then on instead
    of its parts ('not an llmtop recording')."""
    from llmtop.recording.parts import Series

    stems = [src.stem.resolve() for src in sources if isinstance(src, Series)]
    for out in outputs:
        if Path(out).resolve() in stems:
            raise UsageError(f"{out}: output is the stem of the rotated recording read: a "
                             "file there would be read instead of its parts")


def parse_slo_specs(specs: Sequence[str] | None) -> dict[str, float]:
    """The ``--slo`` values as ``{SloConfig field: value}``; a :class:`UsageError` for an
    unknown key, a value that is not a finite number above 0 (at most a day; a target at
    most 1), or a key given twice with different values."""
    out: dict[str, float] = {}
    for spec in specs or ():
        items = spec.split(",")
        if any(not x.strip() for x in items):
            raise UsageError(f"--slo '{spec}' has an empty item; e.g. ttft=0.5,itl_p95=0.05")
        for item in items:
            key, eq, text = (x.strip() for x in item.partition("="))
            key = key.lower()
            if not eq:
                raise UsageError(f"--slo '{spec}': '{item.strip()}' is not KEY=VALUE; "
                                 "e.g. ttft=0.5")
            field = SLO_SPEC_KEYS.get(key)
            if field is None:
                raise UsageError(f"--slo '{spec}': unknown key '{key}'; the keys are ttft, "
                                 "itl_p95 (or itl), tpot, e2e and target")
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if field == "target":
                if not (math.isfinite(value) and 0 < value <= 1):
                    raise UsageError(f"--slo '{spec}': target={text} must be a share more "
                                     "than 0 and at most 1, e.g. target=0.95")
            elif not (math.isfinite(value) and 0 < value <= MAX_SLO_S):
                raise UsageError(f"--slo '{spec}': {key}={text} must be a number of seconds "
                                 f"more than 0 and at most {MAX_SLO_S:,.0f}")
            if field in out and out[field] != value:
                raise UsageError(f"--slo gives {_SLO_NAMES[field]} twice: {out[field]:g} and "
                                 f"{value:g}")
            out[field] = value
    return out


def check_slo_flag(field: str, value: float) -> None:
    """A :class:`UsageError` naming the flag (``--slo-ttft``) unless ``value`` is a number
    of seconds above 0 and at most a day (the target: a share in (0, 1]), the bounds
    ``--slo`` and the config take; NaN fails both."""
    name = SLO_FLAGS[field]
    if field == "target":
        if not 0 < value <= 1:
            raise UsageError(f"{name} must be in (0, 1], got {value}")
        return
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a finite number above 0, got {value}")
    if value > MAX_SLO_S:
        raise UsageError(f"{name} must be at most {MAX_SLO_S:,.0f} (seconds: a day), "
                         f"got {value:g}")


def merge_slo(flags: Mapping[str, float], specs: Sequence[str] | None) -> dict[str, float]:
    """``--slo`` specs merged with the single-SLO flags' values (``{SloConfig field:
    value}``, None left out, each checked by :func:`check_slo_flag`); a
    :class:`UsageError` when both give a key differently."""
    for field, value in flags.items():
        check_slo_flag(field, value)
    out = parse_slo_specs(specs)
    for field, value in flags.items():
        if field in out and out[field] != value:
            raise UsageError(f"{SLO_FLAGS[field]} {value:g} and --slo "
                             f"{_SLO_NAMES[field]}={out[field]:g} disagree; give it once")
        out[field] = value
    return out


def slo_from_args(args: argparse.Namespace) -> dict[str, float]:
    """The SLOs the command line gives (``--slo`` and ``--slo-*``), checked, as
    ``{SloConfig field: value}``."""
    flags = {field: v for field, flag in SLO_FLAGS.items()
             if (v := getattr(args, flag[2:].replace("-", "_"), None)) is not None}
    return merge_slo(flags, getattr(args, "slo", None))


def config_from_args(args: argparse.Namespace, **extra: Any) -> Config:
    """The config ``run``'s flags give over the environment and the file: each key of
    :data:`~llmtop.config.RUN_FLAGS` from its flag's argument (``--rotate-mb`` →
    ``args.rotate_mb``; the ``slo.*`` keys from :func:`slo_from_args`), a bad value named
    by its flag."""
    gpus = getattr(args, "gpus", None)
    devices: list[int] | None = None
    if gpus is not None:
        try:
            devices = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--gpus '{gpus}' must be a comma-separated list of indices") from None
        if not devices:  # ("--gpus ," read as every GPU, which it does not say)
            raise UsageError(f"--gpus '{gpus}' names no GPU: give indices, e.g. 0,1 (leave it "
                             "out for every GPU)")
    trusted = getattr(args, "trusted_proxies", None)
    parsed: dict[str, Any] = {  # (the others are taken as argparse gives them)
        "gpu.devices": devices,
        "trusted_proxies": None if trusted is None else split_list(trusted),
    }
    overrides: dict[str, Any] = {
        key: parsed[key] if key in parsed else getattr(args, flag[2:].replace("-", "_"), None)
        for key, flag in RUN_FLAGS.items() if not key.startswith("slo.")
    }
    overrides.update({f"slo.{k}": v for k, v in slo_from_args(args).items()})
    overrides.update(extra)
    return load_config(config_arg(args), os.environ, overrides, RUN_FLAGS)


def config_arg(args: argparse.Namespace) -> str | None:
    """``--config``'s path (None: not given); a :class:`UsageError` when it is empty (an
    unset shell variable), which the loader called ": config file not found"."""
    path: str | None = getattr(args, "config", None)
    if path is not None and not path.strip():
        raise UsageError(f"--config '{path}' is empty: give a TOML file, or leave --config "
                         "out")
    return path


KEEP_LINES = 2000
"""Lines of a child's output kept (its start-up lines are read as they come)."""


class Child:
    """A llmtop child process whose start-up lines announce its addresses.

    Its stdout and stderr are drained in background threads (so it never blocks on a full
    pipe) and the last :data:`KEEP_LINES` kept in ``lines`` (a proxy that runs for weeks
    must not grow the TUI's memory with every line it prints).
    """

    def __init__(self, cmd: list[str], prefixes: Sequence[str], timeout_s: float = 60.0) -> None:
        self.cmd = cmd
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.found: dict[str, str] = {}
        self._want = set(prefixes)
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True, env=child_env(),
        )
        self._threads = [
            threading.Thread(target=self._pump, args=(s,), daemon=True)
            for s in (self.proc.stdout, self.proc.stderr)
        ]
        for t in self._threads:
            t.start()
        if self._want:  # nothing to wait for when the child announces nothing
            self._ready.wait(timeout_s)

    def _pump(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for raw in iter(stream.readline, ""):
            line = raw.rstrip("\n")
            self.lines.append(line)
            for prefix in self._want:
                if line.startswith(prefix) and prefix not in self.found:
                    self.found[prefix] = line[len(prefix):].strip()
            if self._want <= self.found.keys():
                self._ready.set()
        self._ready.set()

    @property
    def ready(self) -> bool:
        return self._want <= self.found.keys()

    def failure(self) -> str:
        """The child's last words, for an error message."""
        tail = [ln for ln in self.lines if ln.strip()][-3:]
        return " | ".join(tail) or f"exited with code {self.proc.poll()}"

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (graceful), then SIGKILL after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(timeout=2)
        return self.proc.returncode


HANGUP_EXIT_S = 10.0
"""After a hang-up, how long a TUI may take to end once its children have stopped."""


def on_hangup(ending: threading.Event, stop: Callable[[], object],
              done: threading.Event) -> None:
    """SIGHUP (the ssh session or the terminal closed, the pty's master side included)
    ends a TUI and its children (``run``'s proxy, ``demo``'s three) as q does. By default
    it killed the TUI at once: the terminal left in the TUI's modes, the children stopped
    only by their parent watch. Not when SIGHUP was ignored at start (``nohup``).

    The handler sets ``ending``, the event the TUI (or a headless wait) polls (a
    KeyboardInterrupt raised from it could land where Textual catches it), and calls
    ``stop`` (the children's graceful stop) from a thread of its own: on a terminal that
    is gone, Textual's shutdown can block for ever on its output queue (QA: its writes
    fail with EIO), so the children are stopped first (recording footer written) and the
    process ends within :data:`HANGUP_EXIT_S` of that unless ``done`` (the TUI ended).
    """
    if hangup_ignored():
        return

    def stop_all() -> None:
        stop()
        if not done.wait(HANGUP_EXIT_S):
            os._exit(0)  # the terminal is gone: no screen to restore, nobody to tell

    def hung_up(signum: int, frame: object) -> None:
        if not ending.is_set():
            ending.set()
            threading.Thread(target=stop_all, name="llmtop-hangup", daemon=True).start()

    signal.signal(signal.SIGHUP, hung_up)


def llmtop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmtop", *args]


def interrupt_on_sigterm() -> None:
    """Make SIGTERM behave like Ctrl-C in a parent that owns child processes, so its
    ``finally`` blocks stop them instead of leaving orphans."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


@contextlib.contextmanager
def term_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM (``timeout``, systemd, kill) unwinds like Ctrl-C (as
    ``SystemExit(143)``), so temporary files and directories go (in the main thread only:
    elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
