"""Out of file descriptors: ``llmtop run --headless`` under a low ``ulimit -n`` (soft =
hard = 64, so llmtop cannot raise it) in front of a normal ``llmtop sim``, and more
concurrent streams than the limit allows. Real processes, real sockets.

What a user must see: the streams already open finish; a request whose upstream socket
cannot be opened gets a 502 in the API's JSON error shape saying llmtop is out of file
descriptors (not "upstream unreachable": that raised UPSTREAM_DOWN and blamed an engine
that was fine), recorded as an ``error``; one line on the proxy's output, not one per
request and no traceback; no CPU spinning while saturated; and once the streams close,
new requests succeed and no descriptor is left behind. Connections the process cannot
even accept are closed by uvloop (libuv's reserve-descriptor trick): the client sees the
connection drop, and the proxy accepts again once descriptors are free.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import resource
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from proc_support import children
from views_agree import (
    ADMIN_PREFIX,
    LISTEN_PREFIX,
    Announced,
    llmtop_cmd,
    quiet_env,
    start_sim,
)

LIMIT = 64
STREAMS = 80
"""More than LIMIT descriptors' worth of streams (each holds a client and an upstream
socket): some are accepted and answered 502, some not accepted at all."""

STALL = {"X-Sim-Fault": "stall:2000@1"}
"""Each stream of a surge sends a token, then holds its connections open for 2 s."""

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]}


def _limit(n: int, hard: int | None = None) -> Callable[[], None]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n if hard is None else hard))
    return lower


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc, url = start_sim("--set", "max_num_seqs=256", "--set", "kv_cache_tokens=100000")
    try:
        yield url
    finally:
        proc.stop()


def _proxy(upstream: str, record: Path, *extra: str) -> Announced:
    return Announced(
        llmtop_cmd("run", "--upstream", upstream, "--listen", "127.0.0.1:0",
                   "--admin", "127.0.0.1:0", "--record", str(record), "--headless", *extra),
        (LISTEN_PREFIX, ADMIN_PREFIX), quiet_env(), preexec_fn=_limit(LIMIT))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _fds_split(pid: int, upstream: str) -> tuple[int, int]:
    """(descriptors that are sockets connected to ``upstream``'s port, all the others)."""
    port = int(upstream.rsplit(":", 1)[1])
    to_upstream: set[str] = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if int(cols[2].rsplit(":", 1)[1], 16) == port:
                to_upstream.add(f"socket:[{cols[9]}]")
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    pooled = sum(1 for link in links if link in to_upstream)
    return pooled, len(links) - pooled


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _stream(session: aiohttp.ClientSession, url: str,
                  headers: dict[str, str] | None = None) -> tuple[Any, Any]:
    """(status, body) of one streamed request, or ("dropped", why) when the connection
    went before an answer (not accepted: closed by the event loop at once)."""
    try:
        async with session.post(url + CHAT, json=BODY, headers=headers or {},
                                timeout=aiohttp.ClientTimeout(total=90)) as r:
            return r.status, await r.read()
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        return "dropped", repr(exc)


def _one_per_connection() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))


async def _surge(url: str) -> list[tuple[Any, Any]]:
    """STREAMS stalled streams at once: more than the descriptors allow."""
    async with _one_per_connection() as s:
        return list(await asyncio.gather(*[_stream(s, url, STALL) for _ in range(STREAMS)]))


def _check_refusals(results: list[tuple[Any, Any]]) -> Counter[str]:
    kinds = Counter(str(status) for status, _ in results)
    assert kinds["200"] >= 1, kinds  # the streams that got descriptors were served
    assert kinds["502"] >= 1, kinds  # and the limit was reached with a client accepted
    assert set(kinds) <= {"200", "502", "dropped"}, results
    _check_502s(results)
    return kinds


def _check_502s(results: list[tuple[Any, Any]]) -> None:
    for status, body in results:
        if status == 502:
            err = json.loads(body)["error"]
            assert err["type"] == "proxy_error" and err["code"] == "proxy_out_of_files", err
            assert err["message"].startswith(
                f"llmtop: out of file descriptors (ulimit -n {LIMIT})"), err
            assert "unreachable" not in err["message"]


async def _serves(url: str, n: int = 5) -> list[Any]:
    async with aiohttp.ClientSession() as s:
        return [(await _stream(s, url))[0] for _ in range(n)]


def _record_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


HOLD = {"X-Sim-Fault": "stall:12000@1"}
"""A held stream sends a token, then holds its two descriptors for 12 s."""


async def _open_stream(session: aiohttp.ClientSession, url: str,
                       ) -> tuple[Any, asyncio.Task[tuple[Any, Any]] | None]:
    """Start a held stream; (200, the task reading the rest) once its first token came,
    or (status or "dropped", None) when it was refused."""
    ctx = session.post(url + CHAT, json=BODY, headers=HOLD,
                       timeout=aiohttp.ClientTimeout(total=90))
    try:
        resp = await ctx.__aenter__()
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        return "dropped", None
    if resp.status != 200:
        body = await resp.read()
        await ctx.__aexit__(None, None, None)
        return resp.status, body
    first = await resp.content.readuntil(b"\n\n")
    assert first.startswith(b"data: "), first

    async def rest() -> tuple[Any, Any]:
        try:
            return 200, first + await resp.read()
        finally:
            await ctx.__aexit__(None, None, None)
    return 200, asyncio.create_task(rest())


def _kept_alive(port: int, path: str = "/llmtop/v1/recording") -> socket.socket | None:
    """A client (by default of the admin API: same process, same descriptor table) that
    asked once and stays connected, holding one of the process's descriptors; None when
    the connection was closed unanswered (not accepted: no descriptor free)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = c.recv(65536)
        if head.startswith(b"HTTP/1.1 200"):
            return c
        assert not head, head  # not accepted, or a 502 where no stream needed a socket
    except OSError:
        pass
    c.close()
    return None


def _fill(port: int) -> list[socket.socket]:
    """Take every free descriptor of the proxy's process with kept-alive admin clients,
    until none has come free for a while (the proxy closes a refused client's socket a
    moment after the client saw its answer)."""
    held: list[socket.socket] = []
    while len(held) < LIMIT and (c := _kept_alive(port)) is not None:
        held.append(c)
        while len(held) < LIMIT and (c := _kept_alive(port)) is not None:
            held.append(c)
        time.sleep(0.3)
    return held


def _fill_all(pid: int, port: int, idle: list[socket.socket]) -> None:
    """:func:`_fill`, again until the process holds every descriptor it may (a quiet
    0.3 s is not proof: a paused proxy closes a refused client's socket later, and a
    descriptor free then let the next stream be served, 200 for the 502 looked for)."""
    deadline = time.monotonic() + 30
    idle.extend(_fill(port))
    while _fds(pid) < LIMIT:
        assert time.monotonic() < deadline, (_fds(pid), LIMIT)
        idle.extend(_fill(port))


def _fill_workers(port: int, idle: list[socket.socket]) -> None:
    """Kept-alive clients of the proxy's port into ``idle`` until six in a row are closed
    unanswered: every worker full (the kernel hands each new one to any of them)."""
    dropped = 0
    while dropped < 6 and len(idle) < 2 * LIMIT:
        c = _kept_alive(port, "/v1/models")
        if c is None:
            dropped += 1
        else:
            dropped = 0
            idle.append(c)
    assert dropped == 6, len(idle)


def _until_said(proxy: Announced, text: str, within_s: float = 20) -> None:
    """Wait (generously) until a line of the proxy's output holds ``text``."""
    deadline = time.monotonic() + within_s
    while not any(text in line for line in proxy.lines):
        assert time.monotonic() < deadline, proxy.lines
        time.sleep(0.1)


def _fds_below(pid: int, n: int) -> None:
    """Wait (generously) until the process holds fewer than ``n`` descriptors."""
    deadline = time.monotonic() + 15
    while _fds(pid) >= n:
        assert time.monotonic() < deadline, (_fds(pid), n)
        time.sleep(0.02)


def test_a_surge_past_the_open_file_limit_is_refused_clearly_and_recovers(
        sim: str, tmp_path: Path) -> None:
    record = tmp_path / "fds.jsonl"
    proxy = _proxy(sim, record)
    url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    pid = proxy.proc.pid
    seen: dict[str, Any] = {}
    idle: list[socket.socket] = []
    try:
        assert asyncio.run(_serves(url, 2)) == [200, 200]
        before = _fds_split(pid, sim)

        admin_port = int(admin.rsplit(":", 1)[1])

        async def run() -> None:
            # a keep-alive admin connection opened before the surge: the admin API and a
            # recording rotation, asked while no descriptor is free
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as adm, \
                    _one_per_connection() as s:
                async with adm.get(admin + "/llmtop/v1/recording") as r:
                    assert r.status == 200
                spare = _kept_alive(admin_port)
                assert spare is not None
                idle.append(spare)
                held: list[asyncio.Task[tuple[Any, Any]]] = []
                refused: list[tuple[Any, Any]] = []
                for _ in range(LIMIT):  # one at a time until the descriptors run out
                    status, got = await _open_stream(s, url)
                    if status != 200:
                        refused.append((status, got))
                        break
                    assert isinstance(got, asyncio.Task)
                    held.append(got)
                assert refused, "the limit was never reached"
                _fill_all(pid, admin_port, idle)
                spare.close()  # one descriptor free: a client is accepted, its upstream not
                _fds_below(pid, LIMIT)
                refused.append(await _stream(s, url))
                assert refused[-1][0] == 502, refused[-1]
                # a surge while saturated: every one refused, none served
                refused += await asyncio.gather(*[_stream(s, url) for _ in range(STREAMS)])
                seen["refused"] = refused
                seen["saturated_fds"] = _fds(pid)
                cpu0 = _cpu_s(pid)
                await asyncio.sleep(3.0)
                seen["cpu"] = _cpu_s(pid) - cpu0
                async with adm.get(admin + "/llmtop/v1/snapshot?window=10") as r:
                    seen["snapshot"] = r.status
                async with adm.post(admin + "/llmtop/v1/recording",
                                    json={"action": "stop"}) as r:
                    seen["stop"] = (r.status, await r.text())
                _fill_all(pid, admin_port, idle)  # the descriptor the recording had
                async with adm.post(admin + "/llmtop/v1/recording", json={
                        "action": "start", "path": str(tmp_path / "b.jsonl")}) as r:
                    seen["start"] = (r.status, await r.text())
                for c in idle:
                    c.close()
                seen["held"] = await asyncio.gather(*held)

        asyncio.run(run())
        kinds = Counter(str(status) for status, _ in seen["refused"])
        assert set(kinds) <= {"502", "dropped"}, seen["refused"]
        assert kinds["502"] >= 1, kinds
        _check_502s(seen["refused"])
        # the streams it had were served to the end while it refused the others
        assert seen["held"] and all(st == 200 and body.endswith(b"data: [DONE]\n\n")
                                    for st, body in seen["held"]), seen["held"]
        assert seen["saturated_fds"] >= LIMIT - 1, seen["saturated_fds"]
        assert seen["cpu"] < 1.0, f"{seen['cpu']:.2f} CPU s in 3 s while saturated: spinning"
        assert seen["snapshot"] == 200, seen
        assert seen["stop"][0] == 200, seen
        # the new recording cannot be opened now: a clear refusal to retry (503; it was a
        # 400, a bad request), not a 500 or a crash
        start_status, start_text = seen["start"]
        assert start_status == 503, seen["start"]
        assert json.loads(start_text)["error"] == (
            f"{tmp_path / 'b.jsonl'}: cannot open for writing now: Too many open files "
            "(llmtop is out of file descriptors); retry later")

        assert asyncio.run(_serves(url)) == [200] * 5  # accepts and connects again

        async def recent() -> list[dict[str, Any]]:
            async with aiohttp.ClientSession() as s, \
                    s.get(admin + "/llmtop/v1/requests?state=recent") as r:
                assert r.status == 200
                return list(await r.json())
        answered = [r for r in asyncio.run(recent()) if r["status"] == 502]
        assert len(answered) == kinds["502"], answered
        assert all(r["outcome"] == "error"
                   and r["error"].startswith("out of file descriptors") for r in answered)
        pooled, others = _fds_split(pid, sim)
        # nothing left behind: the kept-alive connections to the engine are the pool's, at
        # most one per stream that was open at once; the rest as before, less the
        # recording that could not be started again
        assert pooled <= len(seen["held"]) + 2, (pooled, len(seen["held"]))
        assert others <= before[1] - 1, (before, others)
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0, out
    assert "Traceback" not in out, out
    said = [line for line in proxy.lines if "out of file descriptors" in line]
    assert len(said) == 1, said  # one line, not one per refused request
    assert f"ulimit -n {LIMIT}" in said[0]
    lines = _record_lines(record)
    recorded = [x for x in lines if x["type"] == "request" and x["status"] == 502]
    assert recorded and all(x["outcome"] == "error" for x in recorded)
    # llmtop's own limit is not the engine's outage, nor the engine's errors
    assert not [x for x in lines if x["type"] == "warning" and x["code"] == "UPSTREAM_DOWN"]
    for w in lines:
        if w["type"] == "warning" and w["code"] == "ERRORS" and w["state"] == "raised":
            assert "refused by llmtop, out of file descriptors" in w["message"], w


def test_clients_it_cannot_accept_are_said_once_and_served_when_descriptors_free(
        sim: str, tmp_path: Path) -> None:
    """Only accept() fails (no stream open, every descriptor held by idle clients): uvloop
    closes each new connection before llmtop sees it, so nothing was said at all; the
    periodic probe says it once, and the proxy accepts again once descriptors are free."""
    proxy = _proxy(sim, tmp_path / "accept.jsonl")
    url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    idle: list[socket.socket] = []
    try:
        assert asyncio.run(_serves(url, 1)) == [200]
        _fill_all(proxy.proc.pid, int(admin.rsplit(":", 1)[1]), idle)
        assert asyncio.run(_serves(url, 3)) == ["dropped"] * 3
        _until_said(proxy, "out of file descriptors")  # the probe: once a second
        for c in idle:
            c.close()
        idle = []
        _fds_below(proxy.proc.pid, LIMIT - 4)
        assert asyncio.run(_serves(url)) == [200] * 5
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0 and "Traceback" not in out, out
    said = [line for line in proxy.lines if "out of file descriptors" in line]
    assert len(said) == 1 and f"ulimit -n {LIMIT}" in said[0], said
    assert "new client connections are closed unanswered" in said[0]


class _ClosingMetrics(http.server.BaseHTTPRequestHandler):
    """An engine whose /metrics closes its connection after each answer (HTTP/1.0): every
    scrape needs a new socket."""

    def do_GET(self) -> None:
        body = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_engine_scraping_without_descriptors_says_why_and_recovers(tmp_path: Path) -> None:
    """The scrape that finds no descriptor read "no /metrics at URL (cannot connect: Too
    many open files)", as if the engine had none; now it says it is llmtop's limit."""
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ClosingMetrics)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    proxy = _proxy(f"http://127.0.0.1:{engine.server_address[1]}", tmp_path / "e.jsonl")
    admin = proxy.found[ADMIN_PREFIX]
    idle: list[socket.socket] = []
    statuses: list[str] = []

    async def watch() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as adm:
            async def status() -> str:
                async with adm.get(admin + "/llmtop/v1/snapshot?window=10") as r:
                    assert r.status == 200
                    return str((await r.json())["engine"]["status"])

            async def until(word: str) -> None:
                deadline = time.monotonic() + 45  # the scraper backs off after failures
                while word not in (got := await status()):
                    assert time.monotonic() < deadline, (word, got)
                    await asyncio.sleep(0.2)
                statuses.append(got)

            await until("vllm engine at")
            _fill_all(proxy.proc.pid, int(admin.rsplit(":", 1)[1]), idle)
            await until("out of file descriptors")
            for c in idle:
                c.close()
            idle.clear()
            await until("vllm engine at")
    try:
        asyncio.run(watch())
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
        engine.shutdown()
        engine.server_close()
    url = f"http://127.0.0.1:{engine.server_address[1]}/metrics"
    assert statuses[1] == (f"{url} not scraped: llmtop is out of file descriptors "
                           f"(ulimit -n {LIMIT})"), statuses
    out = "\n".join(proxy.lines)
    assert code == 0 and "Traceback" not in out, out


def test_two_workers_say_when_they_cannot_accept(sim: str, tmp_path: Path) -> None:
    """Each worker is a process of its own (its own descriptors, no observers' tick): its
    event-forwarding loop probes. Kept-alive clients of the proxy fill both workers (each
    reuses its worker's pooled upstream connection: no request needs a new socket, so no
    502 says it), then new clients are dropped unseen; the workers say so."""
    proxy = _proxy(sim, tmp_path / "w2accept.jsonl", "--workers", "2")
    url = proxy.found[LISTEN_PREFIX]
    port = int(url.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    try:
        async def warm() -> list[Any]:  # a pooled upstream connection in each worker
            async with _one_per_connection() as s:
                return [(await _stream(s, url))[0] for _ in range(12)]
        assert asyncio.run(warm()) == [200] * 12
        _fill_workers(port, idle)
        _until_said(proxy, "out of file descriptors")
        for c in idle:
            c.close()
        idle = []
        deadline = time.monotonic() + 20
        while (got := asyncio.run(_serves(url, 1))) != [200]:  # the workers close them
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        assert asyncio.run(_serves(url)) == [200] * 5
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0 and "Traceback" not in out, out
    said = [line for line in proxy.lines if "out of file descriptors" in line]
    assert 1 <= len(said) <= 2 and all(  # one a process: each worker says it once
        "new client connections are closed unanswered" in line for line in said), said


def test_two_workers_out_of_descriptors_refuse_clearly_and_all_survive(
        sim: str, tmp_path: Path) -> None:
    record = tmp_path / "w2.jsonl"
    proxy = _proxy(sim, record, "--workers", "2")
    url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    pid = proxy.proc.pid
    try:
        assert asyncio.run(_serves(url, 2)) == [200, 200]
        workers = children(pid)
        assert len(workers) >= 2, workers
        results = asyncio.run(_surge(url))
        _check_refusals(results)
        assert asyncio.run(_serves(url)) == [200] * 5
        for child in workers:  # no worker died (or was replaced)
            assert Path(f"/proc/{child}").exists(), (child, proxy.lines)

        async def snapshot() -> dict[str, Any]:
            async with aiohttp.ClientSession() as s, \
                    s.get(admin + "/llmtop/v1/snapshot?window=60") as r:
                assert r.status == 200
                return dict(await r.json())
        snap = asyncio.run(snapshot())
        assert snap["system"]["errors"] >= 1, snap["system"]
        codes = {w["code"] for w in snap["warnings"]}
        assert "UPSTREAM_DOWN" not in codes and "WORKER_DOWN" not in codes, snap["warnings"]
    finally:
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0, out
    assert "Traceback" not in out, out
    assert any("out of file descriptors" in line for line in proxy.lines), out
    lines = _record_lines(record)
    assert [x for x in lines if x["type"] == "request" and x["status"] == 502]
    assert not [x for x in lines if x["type"] == "warning" and x["code"] == "UPSTREAM_DOWN"]


def _bench(url: str, *args: str, hard: int = LIMIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(llmtop_cmd("bench", url, *args), capture_output=True, text=True,
                          env=quiet_env(), preexec_fn=_limit(LIMIT, hard), timeout=180,
                          check=False)


OPEN_LOOP = ("--rate", "400", "--requests", "120", "--max-tokens", "4", "--constant",
             "--header", "X-Sim-Fault: stall:2000@1")
"""An open loop whose requests pile up: 120 sent in 0.3 s, each held 2 s by the engine:
more connections at once than 64 descriptors hold."""


def test_bench_out_of_descriptors_in_an_open_loop_says_so_and_leaves_the_level_out(
        sim: str, tmp_path: Path) -> None:
    """Requests bench could not even open a socket for were counted as the target's
    failures ("cannot connect"), and the verdict said the target failed at that rate."""
    record = tmp_path / "bench.jsonl"
    p = _bench(sim, *OPEN_LOOP, "--json", "--record", str(record))
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith("llmtop bench: error:")]
    assert len(said) == 1, p.stderr
    assert said[0].startswith("llmtop bench: error: rate 400/s: llmtop bench ran out of "
                              f"file descriptors (ulimit -n {LIMIT}): "), said
    doc = json.loads(p.stdout)
    assert doc["steps"] == [] and doc["best"] is None, doc  # no figures that are bench's
    assert doc["stopped"] == said[0].removeprefix("llmtop bench: error: ")
    own = [x for x in _record_lines(record) if x["type"] == "request"
           and (x["error"] or "").startswith("out of file descriptors: ")]
    assert own, "the recording names the requests that were never sent"


def test_bench_open_loop_raises_its_soft_open_file_limit(sim: str) -> None:
    """A soft limit of 64 under a hard one of 4096: an open loop asks for the hard one (a
    closed loop asked for what its concurrency needs; an open loop asked for nothing)."""
    p = _bench(sim, *OPEN_LOOP, "--json", hard=4096)
    assert p.returncode == 0, p.stderr
    (step,) = json.loads(p.stdout)["steps"]
    assert step["requests"] == 120 and step["errors"] == 0, step


def test_bench_refuses_a_concurrency_its_open_file_limit_cannot_hold(sim: str) -> None:
    p = _bench(sim, "--concurrency", "100", "--requests", "10")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().endswith(
        f"concurrency 100 needs 164 open files; this process may have {LIMIT} (ulimit -n)")


# -- the OUT_OF_FILES warning: the screens, the admin API and /metrics see it ------------

FDS_WARNING = "OUT_OF_FILES"


async def _fds_warning(adm: aiohttp.ClientSession, admin: str) -> tuple[Any, float | None]:
    """(the snapshot's OUT_OF_FILES warning or None, /metrics' llmtop_warning_active for
    it), asked on ``adm``'s connection."""
    async with adm.get(admin + "/llmtop/v1/snapshot?window=10&histograms=0") as r:
        assert r.status == 200
        found = [w for w in (await r.json())["warnings"] if w["code"] == FDS_WARNING]
    async with adm.get(admin + "/metrics") as r:
        assert r.status == 200
        gauge = [float(line.rsplit(" ", 1)[1]) for line in (await r.text()).splitlines()
                 if line.startswith(f'llmtop_warning_active{{code="{FDS_WARNING}"}}')]
    return (found[0] if found else None), (gauge[0] if gauge else None)


async def _until_fds_warning(adm: aiohttp.ClientSession, admin: str, raised: bool,
                             within_s: float) -> tuple[Any, float | None]:
    deadline = time.monotonic() + within_s
    while ((got := await _fds_warning(adm, admin))[0] is not None) != raised:
        assert time.monotonic() < deadline, (raised, got)
        await asyncio.sleep(0.2)
    return got


def _fds_warning_lines(record: Path) -> list[tuple[str, str]]:
    return [(w["state"], w["message"]) for w in _record_lines(record)
            if w["type"] == "warning" and w["code"] == FDS_WARNING]


def test_clients_it_cannot_accept_raise_out_of_files_on_the_admin_api_until_cleared(
        sim: str, tmp_path: Path) -> None:
    """Only accept() fails (every descriptor held by idle clients): the output's line was
    all there was, and under the TUI nobody sees it. The snapshot's warnings (what the TUI
    and attach show), /metrics and the recording carry OUT_OF_FILES while it lasts, and
    clear it once descriptors are free again (asked on an admin connection opened before:
    the admin API shares the proxy's descriptors)."""
    record = tmp_path / "warn.jsonl"
    proxy = _proxy(sim, record)
    url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    idle: list[socket.socket] = []
    seen: dict[str, Any] = {}

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as adm:
            assert await _serves(url, 1) == [200]
            seen["before"] = await _fds_warning(adm, admin)
            _fill_all(proxy.proc.pid, int(admin.rsplit(":", 1)[1]), idle)
            seen["dropped"] = await _serves(url, 2)
            seen["raised"] = await _until_fds_warning(adm, admin, True, 20)
            for c in idle:
                c.close()
            idle.clear()
            seen["cleared"] = await _until_fds_warning(adm, admin, False, 45)
            seen["served"] = await _serves(url, 2)
    try:
        asyncio.run(run())
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0 and "Traceback" not in out, out
    assert seen["before"] == (None, 0.0), seen  # exported as 0 from the start
    assert seen["dropped"] == ["dropped"] * 2, seen
    warning, gauge = seen["raised"]
    assert (warning["severity"], gauge) == ("critical", 1.0), seen["raised"]
    assert warning["message"].startswith(
        f"the proxy: out of file descriptors (ulimit -n {LIMIT}): new client connections "
        "are closed unanswered"), warning
    assert seen["cleared"] == (None, 0.0), seen
    assert seen["served"] == [200, 200], seen
    # the output's line is still said, once
    said = [line for line in proxy.lines if "out of file descriptors" in line]
    assert len(said) == 1 and said[0].startswith("llmtop: out of file descriptors: "), said
    lines = _fds_warning_lines(record)
    assert [state for state, _ in lines] == ["raised", "cleared"], lines
    assert lines[0][1] == warning["message"]


def test_two_workers_out_of_files_reaches_the_coordinators_warnings_until_cleared(
        sim: str, tmp_path: Path) -> None:
    """A worker probes in its own process, which has no observers: its OUT_OF_FILES
    travels to the coordinator with its events and shows in the one snapshot, /metrics
    and recording (kept-alive clients of the proxy fill both workers, as in
    test_two_workers_say_when_they_cannot_accept; the coordinator has descriptors)."""
    record = tmp_path / "w2warn.jsonl"
    proxy = _proxy(sim, record, "--workers", "2")
    url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
    port = int(url.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    seen: dict[str, Any] = {}

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as adm:
            async with _one_per_connection() as s:  # a pooled upstream socket in each
                assert [(await _stream(s, url))[0] for _ in range(12)] == [200] * 12
            seen["before"] = await _fds_warning(adm, admin)
            _fill_workers(port, idle)
            seen["raised"] = await _until_fds_warning(adm, admin, True, 20)
            for c in idle:
                c.close()
            idle.clear()
            seen["cleared"] = await _until_fds_warning(adm, admin, False, 45)
    try:
        asyncio.run(run())
        deadline = time.monotonic() + 20
        while (got := asyncio.run(_serves(url, 1))) != [200]:  # the workers close them
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
    finally:
        for c in idle:
            c.close()
        code = proxy.stop()
    out = "\n".join(proxy.lines)
    assert code == 0 and "Traceback" not in out, out
    assert seen["before"] == (None, 0.0), seen
    warning, gauge = seen["raised"]
    assert (warning["severity"], gauge) == ("critical", 1.0), seen["raised"]
    who, _, what = warning["message"].partition(": ")
    assert who in ("worker 0", "worker 1", "worker 0, worker 1"), warning
    assert what.startswith(f"out of file descriptors (ulimit -n {LIMIT}): new client "
                           "connections are closed unanswered"), warning
    assert seen["cleared"] == (None, 0.0), seen
    said = [line for line in proxy.lines if "out of file descriptors" in line]
    assert 1 <= len(said) <= 2, said  # the workers' output lines, as before
    lines = _fds_warning_lines(record)
    assert lines and lines[0][0] == "raised" and lines[-1][0] == "cleared", lines
