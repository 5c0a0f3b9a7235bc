"""The command line as the outside contract (shared docs, interfaces.md) writes it.

Each command's synopsis parses with llmtop's own parser, with the flags the page names
(and its ``a | b`` alternatives are exclusive); the two start-up lines are printed exactly,
once each, and flushed — read here from a pipe (no ``PYTHONUNBUFFERED``) or a terminal
while the process still runs — with one process, ``--workers 2`` and the TUI; the
defaults ``--listen 127.0.0.1:8080`` and ``--admin 127.0.0.1:8081`` are the addresses
``run`` binds in each of its modes; bad usage exits 2 with one line and no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from llmtop.cli import build_parser

# -- the page's synopses ------------------------------------------------------------------

SYNOPSES = [
    "run --upstream http://127.0.0.1:9 --listen 127.0.0.1:0 --admin 127.0.0.1:0 "
    "--record r.jsonl --config c.toml --workers 2 --headless",
    "attach http://127.0.0.1:8081",
    "attach http://127.0.0.1:8081 http://127.0.0.1:9081 http://127.0.0.1:10081",
    "replay r.jsonl --speed 10",
    "replay r.jsonl.gz --speed 0.5",
    "report r.jsonl",
    "report r.jsonl r2.jsonl --format text -o out.txt",
    "report r.jsonl --format json -o out.json",
    "report r.jsonl r2.jsonl --format html -o out.html",
    "export r.jsonl --parquet dir",
    "export r.jsonl --hlog out.hlog",
    "bench http://127.0.0.1:8000 --concurrency 1,2,4 --requests 10 --record b.jsonl",
    "bench http://127.0.0.1:8000 --rate 1,2.5 --duration 5",
    "bench http://127.0.0.1:8000 --slo ttft=0.5,itl_p95=0.05,target=0.9",
    "bench http://127.0.0.1:8000",
    "sim --listen 127.0.0.1:0 --profile tiny",
    "sim --profile h200-llama8b",
    "demo",
]


@pytest.mark.parametrize("line", SYNOPSES)
def test_each_synopsis_of_the_page_parses(line: str) -> None:
    args, unknown = build_parser().parse_known_args(line.split())
    assert not unknown, unknown
    assert args.command == line.split()[0]


def _parsed(line: str) -> argparse.Namespace:
    return build_parser().parse_args(line.split())


def test_the_synopsis_flags_reach_the_command() -> None:
    """The values given are the values the command gets (a flag kept for show would
    parse and mean nothing)."""
    run = _parsed(SYNOPSES[0])
    assert (run.upstream, run.listen, run.admin, run.record, run.config, run.workers,
            run.headless) == ("http://127.0.0.1:9", "127.0.0.1:0", "127.0.0.1:0", "r.jsonl",
                              "c.toml", 2, True)
    assert _parsed("replay r.jsonl --speed 10").speed == 10
    report = _parsed("report a.jsonl b.jsonl --format html -o o.html")
    assert (report.file, report.file2, report.format, report.output) == (
        "a.jsonl", "b.jsonl", "html", "o.html")
    assert _parsed("sim --profile h200-llama8b --listen 127.0.0.1:0").profile == "h200-llama8b"


def _exit_of(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "llmtop", *argv], capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("argv", [
    ["bench", "http://127.0.0.1:9", "--concurrency", "1", "--rate", "1"],
    ["bench", "http://127.0.0.1:9", "--requests", "1", "--duration", "1"],
    ["export", "r.jsonl", "--parquet", "d", "--hlog", "h.hlog"],
    ["export", "r.jsonl"],
], ids=["concurrency|rate", "requests|duration", "parquet and hlog", "neither"])
def test_the_alternatives_of_a_synopsis_are_exclusive(argv: list[str]) -> None:
    """``[--concurrency LIST | --rate LIST]``, ``[--requests N | --duration S]``,
    ``(--parquet DIR | --hlog FILE)``: both at once (or, for export, neither) is bad
    usage — exit 2, no traceback."""
    rc, err = _exit_of(argv)
    assert rc == 2, err
    assert "Traceback" not in err and err.strip()


@pytest.mark.parametrize("argv", [
    ["run"],  # no --upstream
    ["run", "--upstream", "http://127.0.0.1:9", "--listen", "nonsense"],
    ["run", "--upstream", "http://127.0.0.1:9", "--workers", "0"],
    ["replay", "/nonexistent/r.jsonl"],
    ["replay", "r.jsonl", "--speed", "0"],
    ["report", "/nonexistent/r.jsonl"],
    ["report", "/nonexistent/r.jsonl", "--format", "pdf"],
    ["export", "/nonexistent/r.jsonl", "--hlog", "-"],
    ["bench", "http://127.0.0.1:9", "--concurrency", "x"],
    ["bench", "http://127.0.0.1:9", "--slo", "nonsense"],
    ["sim", "--profile", "no-such-profile"],
    ["sim", "--listen", "127.0.0.1"],
    ["attach", "not a url"],
    ["demo", "--nonsense"],
], ids=lambda a: " ".join(a))
def test_bad_usage_exits_2_with_one_line(argv: list[str]) -> None:
    rc, err = _exit_of(argv)
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    # argparse's own refusals come with the usage above the one line naming the problem
    problem = [ln for ln in lines if not ln.startswith(("usage:", " "))]
    assert len(problem) == 1, err


def test_a_runtime_failure_exits_1() -> None:
    """``bench`` against a port nobody listens on: nothing succeeded — a runtime failure,
    not bad usage."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, err = _exit_of(["bench", f"http://127.0.0.1:{port}", "--requests", "2"])
    assert rc == 1, err
    assert "Traceback" not in err


# -- start-up lines ------------------------------------------------------------------------

LINE = re.compile(r"llmtop: (proxy|admin) listening on http://(127\.0\.0\.1):([0-9]+)")


def _env() -> dict[str, str]:
    """The caller's environment less llmtop's settings and less PYTHONUNBUFFERED: the
    lines must be flushed by llmtop itself."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("LLMTOP_") and k != "PYTHONUNBUFFERED"} | {
        "LLMTOP_GPU_SOURCE": "none", "LLMTOP_SALT_FILE": os.environ["LLMTOP_SALT_FILE"]}


@contextlib.contextmanager
def _started(argv: list[str], *, tty: bool = False
             ) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``python -m llmtop ARGV`` with stdout on a pipe (or a pseudo-terminal): the process
    and the descriptor its output is read from; stopped (its process group) afterwards."""
    if tty:
        leader, follower = os.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "llmtop", *argv], stdin=follower,
                                stdout=follower, stderr=follower,
                                env={**_env(), "TERM": "xterm"},
                                start_new_session=True)
        os.close(follower)
        fd = leader
    else:
        proc = subprocess.Popen([sys.executable, "-m", "llmtop", *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(),
                                start_new_session=True)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
    try:
        yield proc, fd
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if tty:
            os.close(fd)
        elif proc.stdout is not None:
            proc.stdout.close()


def _read_until(fd: int, proc: subprocess.Popen[bytes], done: re.Pattern[str],
                within_s: float = 60) -> str:
    """What ``fd`` carried until ``done`` matched it (the process still running)."""
    seen = b""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                got = os.read(fd, 65536)
            except OSError:
                got = b""
            if not got:
                break
            seen += got
            text = seen.decode(errors="replace").replace("\r\n", "\n")
            if done.search(text):
                assert proc.poll() is None, "the lines came only at exit"
                return text
    pytest.fail(f"no start-up lines from {proc.args}: {seen[-3000:]!r}")


BOTH = re.compile(r"llmtop: proxy listening on .*\n(?s:.*)llmtop: admin listening on \S+\n"
                  r"|llmtop: admin listening on .*\n(?s:.*)llmtop: proxy listening on \S+\n")
RUN = ["run", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
       "--admin", "127.0.0.1:0"]


def _two_lines(text: str) -> dict[str, int]:
    lines = [ln for ln in text.split("\n") if "listening on" in ln]
    got: dict[str, int] = {}
    for ln in lines:
        m = LINE.search(ln)
        assert m is not None and ln[m.start():] == m[0], ln  # nothing after the address
        assert m[1] not in got, f"two {m[1]} lines: {lines}"
        got[m[1]] = int(m[3])
    assert set(got) == {"proxy", "admin"} and all(got.values()), lines
    assert got["proxy"] != got["admin"]
    return got


@pytest.mark.parametrize("extra", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
def test_port_0_lines_are_flushed_to_a_pipe(extra: list[str]) -> None:
    with _started([*RUN, "--headless", *extra]) as (proc, fd):
        got = _two_lines(_read_until(fd, proc, BOTH))
        for port in got.values():  # the printed addresses are the ones served
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                pass


@pytest.mark.parametrize("extra", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
def test_port_0_lines_under_the_tui(extra: list[str]) -> None:
    """``run`` without --headless, on a terminal: the lines come before the TUI starts."""
    with _started([*RUN, *extra], tty=True) as (proc, fd):
        got = _two_lines(ANSI.sub("", _read_until(fd, proc, BOTH)))
        with socket.create_connection(("127.0.0.1", got["admin"]), timeout=10):
            pass


ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def test_sim_prints_its_address_flushed() -> None:
    with _started(["sim", "--listen", "127.0.0.1:0", "--profile", "tiny"]) as (proc, fd):
        text = _read_until(fd, proc, re.compile(r"listening on \S+\n"))
        m = re.search(r"listening on http://127\.0\.0\.1:([0-9]+)\n", text)
        assert m is not None and int(m[1]) > 0, text


# -- the defaults ----------------------------------------------------------------------------

@contextlib.contextmanager
def _held(port: int) -> Iterator[None]:
    """127.0.0.1:PORT busy for the duration: held here, or already taken by another
    process (busy all the same)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with contextlib.suppress(OSError):
        s.bind(("127.0.0.1", port))
        s.listen()
    try:
        yield
    finally:
        s.close()


MODES = {"headless": ["--headless"], "headless --workers 2": ["--headless", "--workers", "2"],
         "TUI": []}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("flag", "port", "what"), [
    ("--admin", 8080, "listen"), ("--listen", 8081, "admin")], ids=["listen", "admin"])
def test_the_default_addresses(mode: str, flag: str, port: int, what: str) -> None:
    """Without --listen the proxy takes 127.0.0.1:8080, without --admin the admin API
    127.0.0.1:8081, in every mode of ``run``. The test holds the port (a free port is
    never promised on a shared machine), so ``run`` must name the default it could not
    have; the other address is given as port 0."""
    argv = ["run", "--upstream", "http://127.0.0.1:9", flag, "127.0.0.1:0", *MODES[mode]]
    with _held(port), _started(argv, tty=not MODES[mode]) as (proc, fd):
        seen = b""
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    seen += os.read(fd, 65536)
        rc = proc.wait(5)
        with contextlib.suppress(OSError):
            while select.select([fd], [], [], 0.2)[0] and (more := os.read(fd, 65536)):
                seen += more
    text = seen.decode(errors="replace")
    assert f"{what} address 127.0.0.1:{port}: Address already in use" in text, text[-2000:]
    assert rc == 2, text[-2000:]
