"""What does llmtop's proxy add to a stream? Direct vs through llmtop vs through nginx.

Starts ``llmtop sim`` (paced: one decode step every 20 ms for every running sequence,
whatever the batch; and ``--firehose``: as fast as it can), ``llmtop run --headless`` in
front of it (or, with ``--bare``, only the ProxyServer in a small process of its own) and
Debian's nginx (``proxy_buffering off``, HTTP/1.1 keep-alive upstream, one worker; the
benchmark installs it with apt-get when it is missing and writes its config in a temp
dir). Then, for each concurrency level, it runs the same closed-loop load directly against
the simulator, through llmtop and through nginx, interleaved (the order rotates from level
to level), and compares what the client saw with the simulator's ground truth
(``/sim/requests``: when each request arrived and when each content chunk was written):

* added TTFT: per request, (client TTFT) − (engine's arrival → first chunk write); the
  percentiles through a proxy minus the same percentiles direct (the targets' figure). The
  engine stamps ``arrival`` in its handler, so whatever delays the engine's reading of a
  request on this shared machine counts here; the last column, client +TTFT p50, is the
  client's TTFT p50 through a proxy minus direct, engine time included — what a user
  sees, noisier (the engine's own TTFT varies with its step timing);
* added per-chunk delay: per content chunk, (client read time) − (engine write time); the
  percentiles through a proxy minus direct;
* coalesced chunks: content chunks that reached the client in the same read as an
  earlier content chunk (direct shows what the machine itself merges);
* proxy CPU µs per content chunk: the run time of every thread of the proxy's process
  tree, from ``/proc/.../schedstat`` (exact; ``/proc/<pid>/stat``'s clock ticks where
  there is none);
* RSS per open stream: RSS sampled every 0.2 s during the phase is fitted as idle + N ×
  per-stream + growth × t (``split_rss``), idle being the RSS just before the phase; the
  proxies are started afresh (and warmed up) for every level and the figure is taken in
  a first, untimed phase at the level's concurrency (``settle``), so neither the kept
  history of earlier phases' requests nor memory their streams left to the allocator
  (which a later phase would reuse unseen) enters it: memory that comes with open streams is there
  from the first second; what the proxy keeps of finished requests (bounded histories)
  grows with time and is shown apart, as KiB/s. The JSON also has the peak-over-idle figure.

The load generator is a bare asyncio protocol on uvloop in this process; every process
shares this machine's cores, so at high concurrency the absolute figures measure the
machine: the targets are ratios to nginx in the same run.

    python benchmarks/proxy_overhead.py [--duration 5] [--levels 1,64,256]
        [--modes paced,firehose] [--max-tokens 32] [--spread F] [--rounds N] [--bare] [--no-nginx]
        [--splice] [--pin] [--variant ENV=VALUE] [--json OUT]

``--spread F``: the requests ask for answers of different lengths, from ``max-tokens ×
(1 − F)`` to ``× (1 + F)``, as real traffic does. With one length (the default), the
closed loop's streams, started together, keep ending together: every ~``max-tokens`` steps
of the paced engine one step brings most of the streams' ends and new requests at once, and
the proxy's per-request work (~4× a splice's) then delays that step's chunks — at 256
streams this wave, not the per-chunk cost, makes llmtop's chunk p99.

``--pin`` puts the proxies under test (llmtop, nginx, the splice) on the last CPU and
the load generator and the simulator on the others (``sched_setaffinity``): each proxy
then has a core no client competes for. A llmtop with processes of its own
(``--workers``, ``--split-observers``) keeps its proxy processes there and its coordinator
(the observers) goes beside the load generator: the core it would have to spare.
``--variant ENV=VALUE`` adds a row "variant": a second ``llmtop run`` with that environment
variable set, interleaved with the others — an A/B in one run (two runs differ by more
than most changes do: the engine's step timing and the machine's other work move the p99s
by milliseconds).

``--rounds N`` repeats every phase N times (interleaved, the order kept): the table pools
the rounds' samples, and each target also says in how many rounds it held on that round's
own figures ("held in 2 of 3 rounds") — at 256 streams one round's stall can decide a
pooled p99, and two runs of the same code differ by more than most changes do.

``--splice`` adds a reference row, not a target: a 1:1 TCP splice on uvloop that writes
every read to the other side unchanged — what any Python forwarder pays before it does
anything (llmtop's CPU per chunk is then split into the platform's floor and its own work).

For the paced engine, each level also says how far apart the engine wrote a decode step's
chunks (``step_write_gap``, from its ground truth): a proxy that needs more CPU per chunk
than that falls behind within every step, and its chunk p99 grows with the streams, while
one that needs less keeps up — a threshold, which is why the p99 ratio to nginx can be
large where the CPU ratio is under 2.

A target (the simulator direct, llmtop, the variant, nginx, the splice) that does not start,
or that answers no request of a level (every answer an HTTP error, connections refused, its
process gone), measured nothing: its row reads FAILED with why (its exit code and last
lines, the first error the load generator saw), the same is said on stderr, no target is
judged on it, and the benchmark exits 3 (``EXIT_FAILED``) once the rest has run. Exit 0: every
target carried requests at every level (its own errors, if any, are in its row); exit 2: bad
arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

PAT = b'"delta":{"content":"'  # a content chunk of the simulator's OpenAI stream
END = b"\r\n0\r\n\r\n"  # the end of a chunked HTTP/1.1 body
TAIL = max(len(PAT), len(END)) - 1
ID_RE = re.compile(rb'"id":"([^"]+)"')
PACED = ["--set", "base_step_s=0.02", "--set", "per_seq_s=0", "--set", "per_kv_token_s=0",
         "--set", "prefill_tokens_per_s=1e9", "--set", "max_num_seqs=2048",
         "--set", "kv_cache_tokens=10000000", "--set", "max_model_len=100000"]

BARE_PROXY = """
import asyncio, signal, sys
from llmtop.bus import EventBus
from llmtop.config import load_config
from llmtop.proxy.server import ProxyServer

async def main() -> None:
    cfg = load_config(env={}, overrides={"upstream": sys.argv[1], "listen": "127.0.0.1:0"})
    bus = EventBus()
    pump = asyncio.create_task(bus.pump())
    proxy = ProxyServer(cfg, bus)
    print("llmtop: proxy listening on " + await proxy.start(), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.shutdown(1.0)
    pump.cancel()

import uvloop
uvloop.run(main())
"""

SPLICE_PROXY = """
# The floor of any Python forwarder on uvloop: each client connection gets one upstream
# connection of its own and every read goes to the other side as it is, from the protocol's
# data_received (no HTTP parse, no timestamps, no dialect, no records).
import asyncio, sys
import uvloop

HOST, PORT = sys.argv[1].removeprefix("http://").split(":")

class Up(asyncio.Protocol):
    def __init__(self, down):
        self.down = down
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.down.transport.write(data)
    def connection_lost(self, exc):
        self.down.transport.close()

class Down(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.up, self.held = transport, None, []
        asyncio.ensure_future(self.connect())
    async def connect(self):
        loop = asyncio.get_running_loop()
        try:
            _, self.up = await loop.create_connection(lambda: Up(self), HOST, int(PORT))
        except OSError:
            self.transport.close()
            return
        for data in self.held:
            self.up.transport.write(data)
    def data_received(self, data):
        if self.up is None:
            self.held.append(data)
        else:
            self.up.transport.write(data)
    def connection_lost(self, exc):
        if self.up is not None:
            self.up.transport.close()

async def main():
    server = await asyncio.get_running_loop().create_server(Down, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"llmtop: proxy listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    upstream sim {{
        server {upstream};
        keepalive 1024;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""


EXIT_FAILED = 3
"""Exit status when a target measured nothing at some level (see the module doc)."""


# -- processes -------------------------------------------------------------------------


class StartFailed(RuntimeError):
    """A child process (a proxy, nginx, the simulator) that did not come up: why, in one
    line (its exit code and last lines)."""


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def observers_aside(proc: Proc, cpus: set[int] | None) -> None:
    """With ``--pin``: a llmtop that forwards in child processes (``--workers``,
    ``--split-observers``) keeps those on the proxies' CPU and has its coordinator's
    threads moved to ``cpus`` (the load generator's)."""
    if not cpus or len(proc.pids) < 2:
        return
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{proc.proc.pid}/task"):
            os.sched_setaffinity(int(tid), cpus)


def cpu_s(pids: list[int]) -> float:
    """CPU seconds the processes have run: the scheduler's exact run time of each of their
    threads (``/proc/<pid>/task/<tid>/schedstat``, nanoseconds), else user + system time
    from ``/proc/<pid>/stat``, which the kernel counts in whole clock ticks (10 ms): a
    5-second phase of a proxy using 0.1-0.4 s is then off by up to 10 %, one way or the
    other, in each process — too coarse for a ratio to nginx near 2. (schedstat leaves out
    threads that ended during the phase; the proxies here keep theirs.)"""
    total = 0.0
    for pid in pids:
        exact = _run_ns(pid)
        if exact is not None:
            total += exact / 1e9
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _run_ns(pid: int) -> int | None:
    """Nanoseconds on CPU of all of ``pid``'s threads (None: no schedstat here)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except (OSError, ValueError, IndexError):
            return None
    return total


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


class Proc:
    """A child process that prints ``PREFIX URL`` once it listens."""

    def __init__(self, cmd: list[str], prefix: str | None, env: dict[str, str] | None = None,
                 timeout: float = 30.0, cpus: set[int] | None = None) -> None:
        self.cmd = cmd
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True,
                                     preexec_fn=pin)
        self.url = ""
        self.lines: list[str] = []
        if prefix is None:
            return
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:  # its output closed: it has ended, or is ending
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
                break
            self.lines.append(line.rstrip())
            if line.startswith(prefix):
                self.url = line[len(prefix):].strip()
                threading.Thread(target=self._drain, daemon=True).start()
                return
        gone = self.proc.poll()
        self.stop()
        how = (f"exited with code {gone}" if gone is not None
               else f"printed no '{prefix.strip()}' line in {timeout:g} s")
        raise StartFailed(f"{' '.join(cmd[:4])} did not start ({how}): "
                          f"{' | '.join(self.lines[-5:]) or 'no output'}")

    def last_words(self) -> str:
        """Its exit code, if it has exited, and its last lines (stdout and stderr)."""
        rc = self.proc.poll()
        tail = " | ".join(self.lines[-3:])
        return ((f"its process exited with code {rc}" if rc is not None else "")
                + ("; " if rc is not None and tail else "")
                + (f"its last lines: {tail}" if tail else ""))

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def pids(self) -> list[int]:
        return _tree(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_nginx() -> tuple[str | None, str]:
    """The nginx binary, installing Debian's package when missing; or None and why."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        return None, "nginx is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return None, "nginx is not installed and installing it needs root (apt-get)"
    print("installing nginx with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nginx-light"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return None, f"'{' '.join(cmd)}' failed: {r.stderr.strip()[-200:]}"
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    return (found, "") if os.path.exists(found) else (None, "nginx still missing after apt-get")


def start_nginx(binary: str, upstream: str, tmp: Path, cpus: set[int] | None = None) -> Proc:
    port = _free_port()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir(exist_ok=True)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=upstream.removeprefix("http://"),
                                      port=port))
    proc = Proc([binary, "-c", str(conf), "-p", str(tmp)], None, cpus=cpus)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            proc.url = f"http://127.0.0.1:{port}"
            return proc
        if proc.proc.poll() is not None:
            break
        time.sleep(0.05)
    gone = proc.proc.poll()
    proc.stop()
    log = tmp / "error.log"
    raise StartFailed(f"nginx did not start (exit code {gone}): "
                      f"{log.read_text()[-300:] if log.exists() else 'no error.log'}")


# -- the load generator ------------------------------------------------------------------


@dataclass
class Req:
    t_send: float
    rid: str | None = None
    times: list[float] = field(default_factory=list)
    coalesced: int = 0
    ok: bool = True


class Phase:
    def __init__(self, host: str, port: int, requests: list[bytes], n: int, end: float) -> None:
        self.host, self.port, self.n, self.end = host, port, n, end
        self.requests = requests
        """The request each connection sends next, in turn (one unless ``--spread``)."""
        self.sent = 0
        self.results: list[Req] = []
        self.errors = 0
        self.first_error: str | None = None
        """The first thing that went wrong (a status line, a refused connection), to say
        why a target measured nothing."""
        self.open = 0
        self.done = asyncio.get_running_loop().create_future()

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0 and not self.done.done():
            self.done.set_result(None)


class StreamConn(asyncio.Protocol):
    """One keep-alive connection sending the same streaming request until the phase ends."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.transport: asyncio.Transport | None = None
        self.cur: Req | None = None
        self.head = b""
        self.in_body = False
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        if time.time() >= self.phase.end:
            self.cur = None  # its last response ended: closed by the phase's end, not cut
            self.transport.close()
            return
        self.head, self.in_body, self.tail = b"", False, b""
        self.cur = Req(time.time())
        phase = self.phase
        phase.sent += 1
        self.transport.write(phase.requests[phase.sent % len(phase.requests)])

    def data_received(self, data: bytes) -> None:
        now = time.time()
        cur = self.cur
        assert cur is not None
        if not self.in_body:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            if not self.head.startswith(b"HTTP/1.1 200"):
                cur.ok = False
                self.phase.errors += 1
                if self.phase.first_error is None:
                    self.phase.first_error = self.head.partition(b"\r\n")[0].decode(
                        "latin-1")[:120]
                assert self.transport is not None
                self.transport.close()
                return
            data = self.head[i + 4:]
            self.in_body = True
            if not data:
                return
        if cur.rid is None:
            m = ID_RE.search(data)
            if m:
                cur.rid = m.group(1).decode()
        both = self.tail + data
        k = both.count(PAT)
        if k:
            cur.times.extend([now] * k)
            cur.coalesced += k - 1
        self.tail = both[-TAIL:]
        if both.endswith(END):
            self.phase.results.append(cur)
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        phase = self.phase
        if self.cur is not None and self.cur.ok and phase.first_error is None:
            phase.first_error = ("the connection closed before a response ended"
                                 + (f" ({exc})" if exc else ""))
        phase.closed()


def spread_tokens(max_tokens: int, spread: float) -> list[int]:
    """The answers' lengths the load generator asks for in turn: ``max_tokens`` alone, or
    with ``spread`` > 0 every length from ``max_tokens × (1 − spread)`` to ``max_tokens ×
    (1 + spread)`` in a fixed shuffled order (the same in every phase and for every
    target)."""
    if spread <= 0:
        return [max_tokens]
    lo = max(1, round(max_tokens * (1 - spread)))
    hi = max(lo, round(max_tokens * (1 + spread)))
    lengths = list(range(lo, hi + 1))
    random.Random(1).shuffle(lengths)
    return lengths


async def run_load(url: str, n: int, duration: float, max_tokens: int, usage: bool,
                   *, spread: float = 0.0, started: list[Phase] | None = None) -> Phase:
    """``n`` keep-alive connections each sending streaming requests, one after the other,
    for ``duration`` s. All ask for ``max_tokens`` tokens, unless ``spread`` (see
    :func:`spread_tokens`): with one length, streams started together also end together,
    and a paced engine's steps then bring many ends and new requests at once.
    ``started``: the phase is appended to it as it starts (its ``results`` grow as requests
    end: a caller can read them while the load runs)."""
    host, port = url.removeprefix("http://").split(":")
    requests = []
    for tokens in spread_tokens(max_tokens, spread):
        body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": tokens,
                                "messages": [{"role": "user", "content": "hi"}]}
        if usage:
            body["stream_options"] = {"include_usage": True}
        raw = json.dumps(body).encode()
        requests.append(
            (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
             ).encode() + raw)
    loop = asyncio.get_running_loop()
    phase = Phase(host, int(port), requests, n, time.time() + duration)
    if started is not None:
        started.append(phase)
    for _ in range(n):
        phase.open += 1
        try:
            await loop.create_connection(lambda: StreamConn(phase), host, int(port))
        except OSError as exc:  # a target that is not there (any more): its phase says so
            phase.open -= 1
            phase.errors += 1
            if phase.first_error is None:
                why = os.strerror(exc.errno) if exc.errno else str(exc)  # "Connection refused"
                phase.first_error = f"connecting to {host}:{port}: {why}"
    if phase.open == 0 and not phase.done.done():
        phase.done.set_result(None)
    await phase.done
    return phase


# -- one measurement ------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, round(q / 100 * (len(v) - 1)))]


STEP_GAP_S = 0.003
"""Engine writes further apart than this belong to different decode steps (the paced
engine's steps are 20 ms apart; inside one, it writes every stream's chunk in turn)."""


def step_write_gap(write_times: list[float], gap_s: float = STEP_GAP_S) -> float | None:
    """How far apart the engine wrote a decode step's chunks, in seconds: for each step
    (writes no more than ``gap_s`` apart) its span over its writes less one, the median
    over the steps of two writes or more.

    A proxy that spends more CPU per chunk than this falls behind within every step, and
    the step's last chunks wait for the rest: its added chunk delay grows with the
    streams. One that spends less keeps up, and what it adds is the machine's own stalls
    (which on a shared VM vary from run to run): at 256 paced streams on a 2-core VM
    (``--pin --spread 0.5``, 2026-12-03), the engine wrote every ~41 µs, and nginx (26 µs
    a chunk) added a chunk p99 of 0.4 ms where llmtop (43 µs) added 8 — and in the next
    run nginx added 2.4 ms, llmtop 3.4."""
    ts = sorted(write_times)
    gaps: list[float] = []
    start = prev = ts[0] if ts else 0.0
    count = 0
    for t in ts:
        if count and t - prev > gap_s:
            if count > 1:
                gaps.append((prev - start) / (count - 1))
            start, count = t, 0
        prev = t
        count += 1
    if count > 1:
        gaps.append((prev - start) / (count - 1))
    if not gaps:
        return None
    gaps.sort()
    return gaps[len(gaps) // 2]


@dataclass
class Result:
    target: str
    n: int
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    coalesced: int = 0
    ttft_over: list[float] = field(default_factory=list)
    ttft_client: list[float] = field(default_factory=list)
    """TTFT as the client saw it (send to first content chunk), engine time included."""
    chunk_delay: list[float] = field(default_factory=list)
    cpu_us_per_chunk: float | None = None
    rss_kib_per_stream: float | None = None
    """Memory that comes with an open stream (see ``split_rss``)."""
    rss_growth_kib_s: float | None = None
    """What the phase's RSS grew by per second besides (kept history of finished requests)."""
    rss_peak_kib_per_stream: float | None = None
    """(Peak RSS − idle RSS) / streams: the two above in one figure."""
    chunks_per_s: float = 0.0
    unmatched: int = 0
    write_gap_s: float | None = None
    """How far apart the engine wrote a decode step's chunks (``step_write_gap``)."""
    first_error: str | None = None
    """The first error the load generator saw (``Phase.first_error``)."""
    failed: str | None = None
    """Why this target measured nothing at this level (no request answered in full); its
    figures are then no figures (set by ``run_mode``)."""


async def measure(target: str, url: str, pids: list[int], sim_url: str,
                  n: int, duration: float, max_tokens: int, usage: bool,
                  session: aiohttp.ClientSession, *, spread: float = 0.0) -> Result:
    idle_rss = rss_kib(pids) if pids else 0  # nothing open: what the phase adds is on top
    cpu0 = cpu_s(pids)
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    t0 = time.time()

    async def sample() -> None:
        while not stop.is_set():
            samples.append((time.time() - t0, rss_kib(pids)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    sampler = asyncio.create_task(sample())
    phase = await run_load(url, n, duration, max_tokens, usage, spread=spread)
    took = time.time() - t0
    stop.set()
    await sampler
    cpu1 = cpu_s(pids)
    async with session.get(sim_url + "/sim/requests") as r:
        truth = {t["id"]: t for t in await r.json()}
    res = Result(target, n, errors=phase.errors, first_error=phase.first_error)
    mine = [truth[r.rid] for r in phase.results if r.rid in truth]
    res.write_gap_s = step_write_gap([w for t in mine for w in t["chunks"]])
    warm = t0 + min(0.5, duration / 4)
    for req in phase.results:
        res.chunks += len(req.times)
        res.coalesced += req.coalesced
        t = truth.get(req.rid or "")
        if t is None or len(t["chunks"]) != len(req.times) or not req.times:
            res.unmatched += 1
            continue
        res.requests += 1
        if req.t_send < warm:
            continue
        res.ttft_over.append((req.times[0] - req.t_send) - (t["chunks"][0] - t["arrival"]))
        res.ttft_client.append(req.times[0] - req.t_send)
        res.chunk_delay.extend(c - s for c, s in zip(req.times, t["chunks"], strict=True))
    res.chunks_per_s = res.chunks / took if took > 0 else 0.0
    if pids and res.chunks:
        res.cpu_us_per_chunk = (cpu1 - cpu0) / res.chunks * 1e6
    if pids and samples:
        per_stream, growth = split_rss(samples, idle_rss, n, ramp_s=min(1.0, duration / 4))
        res.rss_kib_per_stream = per_stream
        res.rss_growth_kib_s = growth
        res.rss_peak_kib_per_stream = max(0, max(r for _, r in samples) - idle_rss) / n
    return res


def merge_rounds(a: Result, b: Result) -> Result:
    """Two rounds of one target and level as one: samples pooled (percentiles over both),
    counts summed, CPU per chunk weighted by each round's chunks, rates over both phases,
    RSS figures the first round's (a later round finds memory the earlier one's streams
    left to the allocator and would show less than an open stream needs; ``run_mode``
    reports the settling phase's anyway)."""
    chunks = a.chunks + b.chunks
    cpu = None
    if a.cpu_us_per_chunk is not None and b.cpu_us_per_chunk is not None and chunks:
        cpu = (a.cpu_us_per_chunk * a.chunks + b.cpu_us_per_chunk * b.chunks) / chunks
    took = (a.chunks / a.chunks_per_s if a.chunks_per_s else 0.0) + (
        b.chunks / b.chunks_per_s if b.chunks_per_s else 0.0)

    return Result(
        a.target, a.n, requests=a.requests + b.requests, errors=a.errors + b.errors,
        chunks=chunks, coalesced=a.coalesced + b.coalesced,
        ttft_over=a.ttft_over + b.ttft_over, ttft_client=a.ttft_client + b.ttft_client,
        chunk_delay=a.chunk_delay + b.chunk_delay, cpu_us_per_chunk=cpu,
        rss_kib_per_stream=a.rss_kib_per_stream, rss_growth_kib_s=a.rss_growth_kib_s,
        rss_peak_kib_per_stream=a.rss_peak_kib_per_stream,
        chunks_per_s=chunks / took if took > 0 else 0.0, unmatched=a.unmatched + b.unmatched,
        write_gap_s=_mean_of(a.write_gap_s, b.write_gap_s),
        first_error=a.first_error or b.first_error, failed=a.failed or b.failed)


def _mean_of(a: float | None, b: float | None) -> float | None:
    return a if b is None else b if a is None else (a + b) / 2


def split_rss(samples: list[tuple[float, int]], idle_kib: int, n: int, ramp_s: float
              ) -> tuple[float, float | None]:
    """RSS while ``n`` streams are open = idle + n × per-stream + growth × t: the memory
    that comes with open streams is there from the first second on; what the proxy keeps of
    finished requests (bounded histories: recent requests, the detectors' last 30 s, the
    histogram tables) grows with time instead, and would otherwise be counted as per-stream
    cost by a short phase. A least-squares line through the samples after ``ramp_s`` splits
    the two: per-stream KiB from its value at t = 0, history growth KiB/s from its slope
    (both reported). Too few samples: the peak over idle, as one figure."""
    pts = [(t, r) for t, r in samples if t >= ramp_s]
    if len(pts) < 3:
        return max(0, max(r for _, r in samples) - idle_kib) / n, None
    k = len(pts)
    mt = sum(t for t, _ in pts) / k
    mr = sum(r for _, r in pts) / k
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (r - mr) for t, r in pts) / var if var > 0 else 0.0
    slope = max(0.0, slope)
    at0 = mr - slope * mt
    return max(0.0, at0 - idle_kib) / n, slope


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def added(res: Result, base: Result, attr: str, q: float) -> float | None:
    a, b = pct(getattr(res, attr), q), pct(getattr(base, attr), q)
    return None if a is None or b is None else a - b


def print_table(mode: str, rows: list[tuple[Result, Result]]) -> None:
    print(f"\n== {mode} ==")
    print(f"{'streams':>7} {'via':<7} {'reqs':>5} {'chunks/s':>8} "
          f"{'+TTFT p50':>9} {'+TTFT p99':>9} {'+chunk p50':>10} {'+chunk p99':>10} "
          f"{'coalesced':>9} {'CPU us/chunk':>12} {'RSS KiB/stream':>14} {'+KiB/s':>6} "
          f"{'client +TTFT p50':>16}")
    for res, base in rows:
        if res.failed is not None:
            print(f"{res.n:>7} {res.target:<7} FAILED: {res.failed}")
            continue
        if res.target == "direct":
            extra = (f"  (direct: client-engine TTFT overhead p50 {ms(pct(res.ttft_over, 50))}"
                     f" p99 {ms(pct(res.ttft_over, 99))} ms, chunk delay p50 "
                     f"{ms(pct(res.chunk_delay, 50))} p99 {ms(pct(res.chunk_delay, 99))} ms)")
            print(f"{res.n:>7} {'direct':<7} {res.requests:>5} {res.chunks_per_s:>8.0f} "
                  f"{'':>9} {'':>9} {'':>10} {'':>10} {res.coalesced:>9}{extra}")
            continue
        cpu = "n/a" if res.cpu_us_per_chunk is None else f"{res.cpu_us_per_chunk:.1f}"
        rss = "n/a" if res.rss_kib_per_stream is None else f"{res.rss_kib_per_stream:.1f}"
        grow = "n/a" if res.rss_growth_kib_s is None else f"{res.rss_growth_kib_s:.0f}"
        print(f"{res.n:>7} {res.target:<7} {res.requests:>5} {res.chunks_per_s:>8.0f} "
              f"{ms(added(res, base, 'ttft_over', 50)):>9} "
              f"{ms(added(res, base, 'ttft_over', 99)):>9} "
              f"{ms(added(res, base, 'chunk_delay', 50)):>10} "
              f"{ms(added(res, base, 'chunk_delay', 99)):>10} {res.coalesced:>9} "
              f"{cpu:>12} {rss:>14} {grow:>6} "
              f"{ms(added(res, base, 'ttft_client', 50)):>16}"
              + (f"  errors {res.errors}" if res.errors else "")
              + (f"  unmatched {res.unmatched}" if res.unmatched else ""))


FEW_REQUESTS = 30
"""Below this many requests a level's TTFT percentiles are a few requests' own figures."""


Check = tuple[str, bool | None, str]
"""One target: its name, PASS (True), MISS (False) or not judged (None), and the figures."""


def level_targets(n: int, d: Result, ll: Result, ng: Result | None) -> list[Check]:
    """The issue's targets at one level, as ratios to nginx in the same run."""
    out: list[Check] = []
    a50 = added(ll, d, "ttft_over", 50)
    a99 = added(ll, d, "ttft_over", 99)
    c99 = added(ll, d, "chunk_delay", 99)
    n99 = added(ng, d, "ttft_over", 99) if ng else None
    nc99 = added(ng, d, "chunk_delay", 99) if ng else None
    if n == 1:
        # one stream gives a request per answer (paced 32 tokens: ~8 in 5 s): with few,
        # the percentiles are single requests' figures, and the run says so
        few = min(len(ll.ttft_over), len(d.ttft_over))
        caveat = (f" ({few} requests: each percentile is one request's figure; more "
                  "--duration or --rounds)" if few < FEW_REQUESTS else "")
        out.append(("1 stream: added TTFT p50 <= 0.5 ms", None if a50 is None else a50 <= 5e-4,
                    f"{ms(a50)} ms{caveat}"))
        if n99 is not None and a99 is not None:
            out.append(("1 stream: added TTFT p99 <= nginx p99 + 0.5 ms", a99 <= n99 + 5e-4,
                        f"{ms(a99)} vs nginx {ms(n99)} ms{caveat}"))
    elif ng is not None and a99 is not None and n99 is not None and c99 is not None \
            and nc99 is not None:
        # a ratio to a figure at or below zero (nginx within the noise of the direct
        # run, e.g. when the direct run itself saturates the machine) says nothing
        out.append((f"{n} streams: added TTFT p99 <= 1.5x nginx",
                    a99 <= 1.5 * n99 if n99 > 0 else None, f"{ms(a99)} vs nginx {ms(n99)} ms"))
        out.append((f"{n} streams: added chunk delay p99 <= 1.5x nginx",
                    c99 <= 1.5 * nc99 if nc99 > 0 else None,
                    f"{ms(c99)} vs nginx {ms(nc99)} ms"))
        if ll.cpu_us_per_chunk is not None and ng.cpu_us_per_chunk is not None:
            out.append((f"{n} streams: CPU per chunk <= 2x nginx",
                        ll.cpu_us_per_chunk <= 2 * ng.cpu_us_per_chunk,
                        f"{ll.cpu_us_per_chunk:.1f} vs nginx {ng.cpu_us_per_chunk:.1f} us"))
    out.append((f"{n} streams: no coalescing beyond direct", ll.coalesced <= d.coalesced,
                f"llmtop {ll.coalesced}, direct {d.coalesced}"
                + (f", nginx {ng.coalesced}" if ng else "")))
    if n > 1 and ll.rss_kib_per_stream is not None:
        out.append((f"{n} streams: RSS per open stream <= 64 KiB", ll.rss_kib_per_stream <= 64,
                    f"{ll.rss_kib_per_stream:.1f} KiB"))
    return out


def held_in_rounds(n: int, rounds: list[dict[str, Result]]) -> dict[str, tuple[int, int]]:
    """Per target: in how many rounds it held on that round's own figures (each round's
    llmtop against the same round's direct and nginx), of the rounds that judged it — a
    verdict on the pooled samples that one noisy round decides shows here as 1 of 3. (Not
    RSS: the table's figure is the untimed first phase's, see ``settle``; a timed phase's
    own would count memory earlier phases left behind.)"""
    tally: dict[str, tuple[int, int]] = {}
    for by in rounds:
        d, ll = by.get("direct"), by.get("llmtop")
        if d is None or ll is None:
            continue
        ll = dataclasses.replace(ll, rss_kib_per_stream=None)
        for name, ok, _ in level_targets(n, d, ll, by.get("nginx")):
            if ok is not None:
                held, judged = tally.get(name, (0, 0))
                tally[name] = (held + ok, judged + 1)
    return tally


def verdict(mode: str, level_rows: dict[int, dict[str, Result]],
            rounds: dict[int, list[dict[str, Result]]] | None = None) -> list[str]:
    """The issue's targets, as ratios to nginx in the same run; with ``rounds`` (each
    level's rounds, unpooled) and more than one of them, how many rounds each target
    held in."""
    out: list[str] = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        mark = "n/a " if ok is None else ("PASS" if ok else "MISS")
        out.append(f"[{mode}] {mark} {name}: {detail}")

    for n, level in sorted(level_rows.items()):
        failed = [name for name, r in level.items() if r.failed is not None]
        by = {name: r for name, r in level.items() if r.failed is None}
        d, ll, ng = by.get("direct"), by.get("llmtop"), by.get("nginx")
        if failed:
            out.append(f"[{mode}] FAILED {n} streams: {', '.join(failed)} measured nothing"
                       + ("; nothing judged" if d is None or ll is None else
                          "; judged without it"))
        if d is None or ll is None:
            continue
        per_round = (rounds or {}).get(n, [])
        held = held_in_rounds(n, per_round) if len(per_round) > 1 else {}
        for name, ok, detail in level_targets(n, d, ll, ng):
            if name in held:
                k, judged = held[name]
                detail += f" (held in {k} of {judged} rounds)"
            check(name, ok, detail)
        gap = d.write_gap_s
        if mode == "paced" and n > 1 and gap and ll.cpu_us_per_chunk is not None:
            # not a target: why a proxy's chunk p99 stays flat or grows with the streams
            out.append(f"[{mode}] info {n} streams: the engine wrote a step's chunks "
                       f"{gap * 1e6:.0f} us apart (direct run); CPU per chunk llmtop "
                       f"{ll.cpu_us_per_chunk:.1f}"
                       + (f", nginx {ng.cpu_us_per_chunk:.1f}"
                          if ng is not None and ng.cpu_us_per_chunk is not None else "")
                       + " us: a proxy slower than the engine per chunk falls behind "
                         "within each step")
        va = by.get("variant")
        if va is not None and n > 1:
            c99 = added(ll, d, "chunk_delay", 99)
            a99 = added(ll, d, "ttft_over", 99)
            # not a target: the same llmtop with one environment variable changed, in the
            # same run (an A/B whose two sides meet the same machine and engine timing)
            out.append(f"[{mode}] info {n} streams: variant vs llmtop: added chunk delay "
                       f"p50 {ms(added(va, d, 'chunk_delay', 50))} vs "
                       f"{ms(added(ll, d, 'chunk_delay', 50))}, p99 "
                       f"{ms(added(va, d, 'chunk_delay', 99))} vs {ms(c99)} ms; TTFT p99 "
                       f"{ms(added(va, d, 'ttft_over', 99))} vs {ms(a99)} ms; coalesced "
                       f"{va.coalesced} vs {ll.coalesced}; CPU "
                       f"{va.cpu_us_per_chunk or 0:.1f} vs {ll.cpu_us_per_chunk or 0:.1f} us/chunk")
        sp = by.get("splice")
        if n > 1 and sp is not None and sp.cpu_us_per_chunk and ll.cpu_us_per_chunk:
            # not a target: how much of llmtop's cost any Python forwarder pays
            out.append(f"[{mode}] info {n} streams: CPU per chunk llmtop "
                       f"{ll.cpu_us_per_chunk:.1f}, a bare uvloop splice (--splice) "
                       f"{sp.cpu_us_per_chunk:.1f}"
                       + (f", nginx {ng.cpu_us_per_chunk:.1f} us: splice "
                          f"{sp.cpu_us_per_chunk / ng.cpu_us_per_chunk:.2f}x nginx"
                          if ng is not None and ng.cpu_us_per_chunk else " us")
                       + f", llmtop {ll.cpu_us_per_chunk / sp.cpu_us_per_chunk:.2f}x splice")
    return out


# -- main ---------------------------------------------------------------------------------


def why_nothing(res: Result, proc: Proc | None) -> str:
    """Why ``res`` (no request answered in full) measured nothing, in one line: what the
    load generator saw, and the target's process if it has exited or said something."""
    seen = []
    if res.first_error:
        seen.append(f"the load generator saw: {res.first_error}")
    if res.errors:
        seen.append(f"{res.errors} requests failed")
    if res.unmatched:
        seen.append(f"{res.unmatched} answers did not match the engine's records")
    if not seen:
        seen.append("no request was answered in full")
    words = proc.last_words() if proc is not None else ""
    return "; ".join(seen + ([words] if words else []))


def say_failed(where: str, name: str, why: str, who: str = "proxy_overhead") -> None:
    """Say on stderr that target ``name`` measured nothing, and why."""
    print(f"{who}: {where}: {name} FAILED: {why}", file=sys.stderr, flush=True)


async def settle(targets: dict[str, tuple[str, Proc | None]], sim_url: str, n: int,
                 duration: float, max_tokens: int, usage: bool,
                 session: aiohttp.ClientSession, *, spread: float = 0.0) -> dict[str, Result]:
    """A first phase at the level's concurrency for each fresh proxy, not counted in the
    timed rounds. Its RSS figures are the level's (a process that has served nothing but
    the warm-up: no earlier phase's history counts as this level's streams, and no memory
    earlier streams freed is reused unseen); and it brings the proxy to the steady state
    the timed rounds measure — upstream connections open, as in a proxy that has been
    running (a fresh process meeting 1,024 streams at once opens 1,024 upstream
    connections in one burst, which this machine's simulator takes seconds to accept)."""
    out: dict[str, Result] = {}
    for name, (url, proc) in targets.items():  # (a target that did not start is not here)
        if proc is not None:
            out[name] = await measure(name, url, proc.pids, sim_url, n, duration, max_tokens,
                                      usage, session, spread=spread)
            await asyncio.sleep(0.3)
    return out


def with_rss_of(res: Result, cold: Result) -> Result:
    """``res`` with the RSS figures of the settling phase (see :func:`settle`)."""
    return dataclasses.replace(res, rss_kib_per_stream=cold.rss_kib_per_stream,
                               rss_growth_kib_s=cold.rss_growth_kib_s,
                               rss_peak_kib_per_stream=cold.rss_peak_kib_per_stream)


async def warm_up(url: str, max_tokens: int) -> None:
    with contextlib.suppress(Exception):
        await run_load(url, 2, 0.3, max_tokens, False)


async def run_mode(mode: str, args: argparse.Namespace, nginx_bin: str | None,
                   env: dict[str, str], tmp: Path, report: dict[str, Any],
                   failures: list[str]) -> list[str]:
    """One mode's levels: the table printed, the JSON's figures in ``report``, the verdict
    returned; each target that measured nothing at a level is said on stderr and added to
    ``failures``."""
    py = sys.executable
    sim_cmd = [py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1"]
    sim_cmd += ["--firehose"] if mode == "firehose" else PACED
    procs: list[Proc] = []
    proxies: list[Proc] = []
    try:
        load_cpus, proxy_cpus = args.pin if args.pin else (None, None)
        sim = Proc(sim_cmd, "llmtop: sim listening on ", env, cpus=load_cpus)
        procs.append(sim)
        run_cmd = [py, "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
                   "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]

        not_started: dict[str, str] = {}
        """The targets of this level that did not start, and why."""

        def start(name: str, targets: dict[str, tuple[str, Proc | None]],
                  begin: Callable[[], Proc], aside: bool = False) -> None:
            """Start one proxy as target ``name``; one that does not start is said (stderr)
            and left out of this level, the others are measured."""
            try:
                proc = begin()
            except StartFailed as exc:
                not_started[name] = str(exc)
                return
            proxies.append(proc)
            if aside:
                observers_aside(proc, load_cpus)
            targets[name] = (proc.url, proc)

        async def start_proxies() -> dict[str, tuple[str, Proc | None]]:
            """Fresh proxies, warmed up: each level's RSS per stream is then what its
            streams add to a process that has served nothing else (after a busier phase
            the allocator keeps memory the next phase's streams reuse unseen, and kept
            history of finished requests would count as theirs)."""
            for p in proxies:
                p.stop()
            proxies.clear()
            not_started.clear()
            targets: dict[str, tuple[str, Proc | None]] = {"direct": (sim.url, None)}
            if args.bare:
                start("llmtop", targets, lambda: Proc(
                    [py, "-c", BARE_PROXY, sim.url], "llmtop: proxy listening on ", env,
                    cpus=proxy_cpus), aside=True)
            else:
                start("llmtop", targets, lambda: Proc(
                    run_cmd, "llmtop: proxy listening on ", env, cpus=proxy_cpus), aside=True)
            if args.variant:
                key, _, value = args.variant.partition("=")
                start("variant", targets, lambda: Proc(
                    run_cmd, "llmtop: proxy listening on ", {**env, key: value},
                    cpus=proxy_cpus), aside=True)
            if nginx_bin:
                start("nginx", targets,
                      lambda: start_nginx(nginx_bin, sim.url, tmp / mode, proxy_cpus))
            if args.splice:
                start("splice", targets, lambda: Proc(
                    [py, "-c", SPLICE_PROXY, sim.url], "llmtop: proxy listening on ", env,
                    cpus=proxy_cpus))
            for url, _ in targets.values():
                await warm_up(url, args.max_tokens)
            return targets

        rows: list[tuple[Result, Result]] = []
        level_rows: dict[int, dict[str, Result]] = {}
        rounds: dict[int, list[dict[str, Result]]] = {}
        order = (["direct", "llmtop"] + (["variant"] if args.variant else [])
                 + (["nginx"] if nginx_bin else []) + (["splice"] if args.splice else []))
        async with aiohttp.ClientSession() as session:
            for li, n in enumerate(args.levels):
                targets = await start_proxies()
                cold = await settle(targets, sim.url, n, args.duration, args.max_tokens,
                                    args.client_usage, session, spread=args.spread)
                by: dict[str, Result] = {}
                level_rounds: list[dict[str, Result]] = []
                rot = order[li % len(order):] + order[: li % len(order)]
                for _ in range(args.rounds):
                    this_round: dict[str, Result] = {}
                    level_rounds.append(this_round)
                    for name in rot:
                        if name not in targets:
                            continue  # it did not start
                        url, proc = targets[name]
                        pids = proc.pids if proc is not None else []
                        res = await measure(name, url, pids, sim.url, n,
                                            args.duration, args.max_tokens, args.client_usage,
                                            session, spread=args.spread)
                        this_round[name] = res
                        prev = by.get(name)
                        by[name] = res if prev is None else merge_rounds(prev, res)
                        print(f"  {mode} n={n} {name}: {res.requests} requests, "
                              f"{res.chunks_per_s:.0f} chunks/s", flush=True)
                        await asyncio.sleep(0.3)
                by = {name: with_rss_of(r, cold[name]) if name in cold else r
                      for name, r in by.items()}
                for name in order:
                    why = (not_started[name] if name in not_started
                           else why_nothing(by[name], targets[name][1])
                           if by[name].requests == 0 else None)
                    if why is not None:
                        by[name] = dataclasses.replace(by.get(name) or Result(name, n),
                                                       failed=why)
                        say_failed(f"[{mode}] {n} streams", name, why)
                        failures.append(f"[{mode}] {n} streams: {name}: {why}")
                level_rows[n] = by
                rounds[n] = level_rounds
                rows.extend((by[name], by["direct"]) for name in order)
        print_table(mode, rows)
        report[mode] = {
            str(n): {name: {
                "requests": r.requests, "errors": r.errors, "chunks": r.chunks,
                "coalesced": r.coalesced, "chunks_per_s": r.chunks_per_s,
                "ttft_overhead_p50_s": pct(r.ttft_over, 50),
                "ttft_client_p50_s": pct(r.ttft_client, 50),
                "ttft_overhead_p99_s": pct(r.ttft_over, 99),
                "chunk_delay_p50_s": pct(r.chunk_delay, 50),
                "chunk_delay_p99_s": pct(r.chunk_delay, 99),
                "cpu_us_per_chunk": r.cpu_us_per_chunk,
                "rss_kib_per_stream": r.rss_kib_per_stream,
                "rss_growth_kib_s": r.rss_growth_kib_s,
                "rss_peak_kib_per_stream": r.rss_peak_kib_per_stream,
                "engine_write_gap_s": r.write_gap_s,
                "failed": r.failed,
            } for name, r in by.items()} for n, by in level_rows.items()}
        return verdict(mode, level_rows, rounds)
    finally:
        for p in [*reversed(proxies), *reversed(procs)]:
            p.stop()


def run_on_uvloop(main: Coroutine[Any, Any, int]) -> int:
    """Run a benchmark's ``main`` on uvloop (asyncio's loop where it is not installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def imported_from(env: dict[str, str]) -> str:
    """The directory a ``python -m llmtop`` started with ``env`` imports llmtop from."""
    r = subprocess.run([sys.executable, "-c", "import llmtop; print(llmtop.__path__[0])"],
                       env=env, capture_output=True, text=True, check=False)
    return r.stdout.strip() or f"nowhere ({r.stderr.strip()[-200:]})"


async def amain(args: argparse.Namespace) -> int:
    # PYTHONSAFEPATH: ``python -m llmtop`` would import the llmtop of the working directory
    # first, before PYTHONPATH, and a ``--variant PYTHONPATH=DIR`` ran the same code twice
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1",
           "PYTHONSAFEPATH": "1"}
    if args.variant:
        key, _, value = args.variant.partition("=")
        print(f"variant: {args.variant}; llmtop imported from {imported_from(env)} and, "
              f"for the variant, from {imported_from({**env, key: value})}", flush=True)
    nginx_bin, why = (None, "--no-nginx") if args.no_nginx else ensure_nginx()
    if nginx_bin is None:
        print(f"nginx: not measured ({why})", flush=True)
    print(f"llmtop proxy overhead: levels {args.levels}, {args.duration:g} s per phase, "
          f"{args.max_tokens} tokens per request"
          + (f" (± {args.spread:.0%})" if args.spread else "") + f", modes {args.modes}, "
          f"{'bare ProxyServer' if args.bare else 'llmtop run --headless'}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    report: dict[str, Any] = {"levels": args.levels, "duration_s": args.duration,
                              "max_tokens": args.max_tokens, "spread": args.spread,
                              "bare": args.bare,
                              "splice": args.splice, "nginx": nginx_bin is not None}
    lines: list[str] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="llmtop-bench-") as tmpdir:
        for mode in args.modes:
            (Path(tmpdir) / mode).mkdir()
            try:
                lines += await run_mode(mode, args, nginx_bin, env, Path(tmpdir), report,
                                        failures)
            except StartFailed as exc:  # the simulator: nothing of this mode to measure
                say_failed(f"[{mode}]", "the simulator", str(exc))
                failures.append(f"[{mode}] the simulator: {exc}")
    print("\nTargets (issue 3; ratios to nginx in the same run):")
    for line in lines:
        print("  " + line)
    if args.json:
        report["verdict"] = lines
        report["failed"] = failures
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(report, indent=2))
    if failures:
        print(f"proxy_overhead: FAILED: {len(failures)} target(s) measured nothing; their "
              f"rows are no result (exit {EXIT_FAILED}):", file=sys.stderr)
        for line in failures:
            print("  " + line, file=sys.stderr)
        return EXIT_FAILED
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"Exit status: 0 when every target carried requests at "
                                f"every level; {EXIT_FAILED} when one measured nothing at a "
                                "level (did not start, or answered no request: its rows read "
                                "FAILED and stderr says why); 2 for bad arguments.")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per phase (default 5)")
    p.add_argument("--levels", default="1,64,256",
                   help="concurrent streams, comma-separated (default 1,64,256)")
    p.add_argument("--modes", default="paced,firehose", help="paced,firehose (default both)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default 32)")
    p.add_argument("--spread", type=float, default=0.0, metavar="F",
                   help="answers of different lengths: each request asks for one of "
                        "max-tokens × (1 − F) ... × (1 + F) tokens, in turn (default 0: all "
                        "alike, so streams that start together end together and the paced "
                        "engine's steps bring waves of ends and new requests)")
    p.add_argument("--rounds", type=int, default=1, help="repeat each phase (default 1)")
    p.add_argument("--bare", action="store_true",
                   help="run only the ProxyServer (no metrics side) instead of llmtop run")
    p.add_argument("--client-usage", action="store_true",
                   help="clients ask for usage themselves (no injection/stripping)")
    p.add_argument("--no-nginx", action="store_true", help="skip the nginx comparison")
    p.add_argument("--splice", action="store_true",
                   help="also measure a bare uvloop TCP splice (no parsing, no timestamps): "
                        "the floor of any Python forwarder, for reference")
    p.add_argument("--pin", action="store_true",
                   help="the proxy under test (llmtop, nginx, splice) on the last CPU, and the "
                        "load generator and the simulator on the others (sched_setaffinity): "
                        "the proxies then compete with no client for their core")
    p.add_argument("--variant", metavar="ENV=VALUE",
                   help="also measure a second llmtop run with this environment variable set "
                        "(row 'variant', interleaved with the others: an A/B in one run)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args()
    if args.variant is not None and "=" not in args.variant:
        p.error("--variant: ENV=VALUE")
    if args.variant and args.bare:
        p.error("--variant measures llmtop run, not --bare")
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            p.error(f"--pin needs at least 2 CPUs (this process may use {len(cpus)})")
        args.pin = (set(cpus[:-1]), {cpus[-1]})
        os.sched_setaffinity(0, args.pin[0])  # the load generator (this process)
    try:
        args.levels = [int(x) for x in args.levels.split(",") if x]
        args.modes = [m for m in args.modes.split(",") if m]
    except ValueError:
        p.error("--levels must be integers")
    if not 0 <= args.spread < 1:
        p.error("--spread: a fraction, 0 <= F < 1")
    if not set(args.modes) <= {"paced", "firehose"}:
        p.error("--modes: paced and/or firehose")
    return run_on_uvloop(amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
