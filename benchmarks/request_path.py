"""The proxy's Python per request, without sockets: the whole path of a short request, warm.

One :class:`~llmtop.proxy.server.ProxyServer` (the real one: started, its pool, its
server protocol) serves requests from stand-in transports: the client's request goes in
through the connection protocol's ``data_received`` (the direct path, as a keep-alive
client's whole request in one read takes it), the upstream's response — captured once
from ``llmtop sim --firehose`` for the request exactly as the proxy sent it — comes back
in one read through the upstream connection's ``data_received``, and the loop runs until
the record is on the bus. What is timed is everything the proxy's thread does for the
request except the system calls (the writes go to stand-ins that take them at once) and
the event loop's polling: the figure a change to the per-request Python moves, without
the scheduler noise of a loaded machine.

Each kind of the mix (``s1``: a streaming chat completion of 1 token, ``s4``: 4,
``n4``: a non-streaming one of 4) is timed on its own; the figure is the fastest of
many short batches in CPU time (as ``timeit`` does), µs per request.

Each proxy under test runs in a process of its own that times what this one asks of it;
``--variant ENV=VALUE`` (repeatable) adds one started with that environment variable set
(``PYTHONPATH=/tmp/old`` after ``git archive REV llmtop | tar -x -C /tmp/old``; every
process runs with ``python -P``, so the current directory does not shadow it), and the
measurements alternate between them, the order rotating each round: this machine's speed
drifts by more between two runs than most changes move the figure. All of them are given
the same upstream responses, and each prints the SHA-256 of what its client received and
of what it sent upstream, which must match the base's.

    python benchmarks/request_path.py [--rounds 8] [--seconds 0.5] [--kinds s1,s4,n4]
        [--variant ENV=VALUE ...] [--profile OUT.prof]

``--profile OUT.prof``: the base process first runs the mix under cProfile for
``--seconds`` and writes the stats there.

A proxy process (the base or a variant) that does not start, or that ends before it has
answered, measured nothing: stderr says which, with its exit code (its own error is on
stderr above), its line reads FAILED instead of a figure, and the run exits 3 once the
others are measured (0: every proxy gave its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import EXIT_FAILED, Proc, say_failed
from request_cost import _request

from llmtop.bus import EventBus
from llmtop.config import load_config
from llmtop.proxy.server import ProxyServer
from llmtop.proxy.stamping import StampingRequestHandler
from llmtop.proxy.upstream import UpstreamConnection


class _GCTime:
    """Collections per generation and the time they took (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.ns = 0
        self.requests = 0
        self._t0 = 0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.counts[info["generation"]] += 1
            self.ns += time.perf_counter_ns() - self._t0

    def take(self) -> tuple[int, int, int, int, float]:
        out = (*self.counts, self.requests, self.ns / 1e9)
        self.counts, self.ns, self.requests = [0, 0, 0], 0, 0
        return out  # type: ignore[return-value]


gc_time = _GCTime()


class _Transport:
    """Takes every write at once, as a socket with room does; keeps what it was given."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, data: list[bytes]) -> None:
        self.out.extend(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def client_request(kind: str) -> bytes:
    """The kind's request as request_cost.py sends it (the openai Python SDK's headers)."""
    return _request("127.0.0.1:8080", kind)


def fetch(url: str, raw: bytes) -> bytes:
    """``raw`` sent to the simulator on a connection of its own; its whole response."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(raw)
        got = b""
        while True:
            part = s.recv(65536)
            got += part
            if not part or got.endswith(b"\r\n0\r\n\r\n") or (
                    b"content-length:" in got.lower() and _whole(got)):
                return got


def _whole(got: bytes) -> bool:
    head, sep, body = got.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return len(body) >= int(v)
    return False


class Harness:
    """A started proxy, one client connection and one pooled upstream connection, all on
    stand-in transports."""

    def __init__(self, proxy: ProxyServer, loop: asyncio.AbstractEventLoop) -> None:
        self.proxy = proxy
        self.loop = loop
        assert proxy._runner is not None and proxy._runner.server is not None
        handler = proxy._runner.server()
        assert isinstance(handler, StampingRequestHandler)
        self.handler = handler
        self.client = _Transport()
        self.handler.connection_made(self.client)  # type: ignore[arg-type]
        pool = proxy.pool
        assert pool is not None
        self.conn = UpstreamConnection(pool)
        self.up = _Transport()
        self.conn.connection_made(self.up)  # type: ignore[arg-type]
        pool._all.add(self.conn)
        pool._idle.append(self.conn)

    async def one(self, request: bytes, response: bytes) -> None:
        """One request through the proxy, its response in one read."""
        self.up.out.clear()
        self.handler.data_received(request)
        assert self.up.out, "not taken by the direct path"
        self.conn.data_received(response)
        await self.settle()

    async def settle(self) -> None:
        """Run the loop until the request has ended (its record is on the bus): a direct
        request ends on callbacks, a loop turn or two after its last byte."""
        while self.handler.direct is not None:  # noqa: ASYNC110 - the turns are timed too
            await asyncio.sleep(0)


def child(args: argparse.Namespace) -> int:
    import uvloop

    store = Path(args.responses)
    saved: dict[str, str] = json.loads(store.read_text()) if store.exists() else {}
    return uvloop.run(serve_child(args, store, saved))


async def serve_child(args: argparse.Namespace, store: Path, saved: dict[str, str]) -> int:
    """One proxy under test: set up, then time what the parent asks for on stdin
    (``KIND SECONDS`` per line, answered ``KIND µs/request``)."""
    cfg = load_config(env={}, overrides={"upstream": args.child, "listen": "127.0.0.1:0"})
    bus = EventBus()
    proxy = ProxyServer(cfg, bus)
    await proxy.start()
    h = Harness(proxy, asyncio.get_running_loop())
    kinds = args.kinds.split(",")
    cases: dict[str, tuple[bytes, bytes]] = {}
    for kind in kinds:
        req = client_request(kind)
        h.up.out.clear()
        h.handler.data_received(req)
        sent = b"".join(h.up.out)
        if kind in saved:
            resp = saved[kind].encode("latin-1")
        else:
            resp = fetch(args.child, sent)
            saved[kind] = resp.decode("latin-1")
        h.conn.data_received(resp)
        await h.settle()
        cases[kind] = (req, resp)
        h.client.out.clear()
        await h.one(req, resp)
        got = b"".join(h.client.out)
        print(f"{kind}: the client got {len(got)} bytes, sha256 "
              f"{hashlib.sha256(got).hexdigest()[:16]}; upstream got {len(sent)} bytes, "
              f"sha256 {hashlib.sha256(sent).hexdigest()[:16]}", flush=True)
    # the base process saves the responses before it says "ready" to the parent, which
    # starts the variants after that: they are given the very same bytes
    await asyncio.to_thread(store.write_text, json.dumps(saved))
    if args.profile:
        import cProfile
        prof = cProfile.Profile()
        end = time.perf_counter() + args.seconds
        n = 0
        prof.enable()
        while time.perf_counter() < end:
            for req, resp in cases.values():
                await h.one(req, resp)
                n += 1
            bus.drain()
        prof.disable()
        prof.dump_stats(args.profile)
        print(f"profiled {n} requests -> {args.profile}", flush=True)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    batch = 20
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)  # between measurements
        if not line.strip():
            break
        kind, seconds = line.split()
        req, resp = cases[kind]
        best = float("inf")
        end = time.perf_counter() + float(seconds)
        gc_time.take()
        while time.perf_counter() < end:
            t0 = time.thread_time()
            for _ in range(batch):
                await h.one(req, resp)
            best = min(best, time.thread_time() - t0)
            gc_time.requests += batch
            h.client.out.clear()
            bus.drain()  # nobody subscribes: the batch's records are dropped
        g = gc_time.take()
        print(f"{kind} {best / batch * 1e6:.2f} {g[4] / max(1, g[3]) * 1e6:.2f}", flush=True)
    await proxy.shutdown(0.1)
    return 0


def parent(args: argparse.Namespace) -> int:
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1"}
    py = sys.executable
    kinds = args.kinds.split(",")
    sim = Proc([py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1",
                "--firehose"], "llmtop: sim listening on ", env)
    names = ["base", *args.variant]
    children: list[subprocess.Popen[str]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = str(Path(tmp) / "responses.json")
            failed: dict[str, str] = {}
            """The proxies that measured nothing, and why."""

            def gone(name: str, c: subprocess.Popen[str], when: str) -> None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.wait(10)
                failed[name] = (f"its process {when} (exit code {c.poll()}; its own error "
                                "is on stderr above)")
                say_failed(when, name, failed[name], "request_path")

            for name in names:
                extra = dict([name.split("=", 1)]) if "=" in name else {}
                cmd = [py, "-P", __file__, "--child", sim.url, "--responses", store,
                       "--kinds", args.kinds, "--seconds", str(args.seconds)]
                if args.profile and name == "base":
                    cmd += ["--profile", args.profile]
                c = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**env, **extra})
                children.append(c)
                assert c.stdout is not None
                while (line := c.stdout.readline().strip()) != "ready":
                    if not line:
                        gone(name, c, "did not start")
                        if name == "base":  # the variants would have no responses to share
                            return EXIT_FAILED
                        break
                    print(f"  {name}: {line}")
            best: dict[tuple[str, str], list[float]] = {}
            for r in range(args.rounds):
                for kind in kinds:
                    order = list(range(len(children)))
                    order = order[r % len(order):] + order[: r % len(order)]
                    for k in order:
                        c = children[k]
                        if names[k] in failed:
                            continue
                        assert c.stdin is not None and c.stdout is not None
                        try:
                            c.stdin.write(f"{kind} {args.seconds}\n")
                            c.stdin.flush()
                            reply = c.stdout.readline().split()
                        except BrokenPipeError:
                            reply = []
                        if len(reply) != 3:
                            gone(names[k], c, "ended before it answered")
                            continue
                        best.setdefault((names[k], kind), []).append(float(reply[1]))
            print(f"\nproxy Python per request, µs (fastest batch of {args.rounds} rounds × "
                  f"{args.seconds:g} s; median of the rounds' fastest in brackets):")
            for kind in kinds:
                base = min(best[("base", kind)]) if "base" not in failed else float("nan")
                cols = []
                for name in names:
                    if name in failed:
                        cols.append(f"{name}: FAILED")
                        continue
                    v = best[(name, kind)]
                    cols.append(f"{name}: {min(v):6.1f} [{statistics.median(v):6.1f}]"
                                + ("" if name == "base" else f" ({min(v) / base - 1:+.1%})"))
                print(f"  {kind}: " + "   ".join(cols))
            for name, why in failed.items():
                print(f"  FAILED {name}: {why}")
    finally:
        for c in children:
            if c.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    c.stdin.close()
            c.wait(10)
        sim.stop()
    if failed:
        print(f"request_path: FAILED: {', '.join(failed)} measured nothing; no figure for it "
              f"(exit {EXIT_FAILED})", file=sys.stderr)
        return EXIT_FAILED
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"Exit status: 0 when every proxy gave its figures; "
                                f"{EXIT_FAILED} when one measured nothing (did not start, or "
                                "ended: its line reads FAILED and stderr says why).")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=0.5, help="per kind and round")
    p.add_argument("--kinds", default="s1,s4,n4")
    p.add_argument("--variant", action="append", default=[], metavar="ENV=VALUE")
    p.add_argument("--profile", metavar="OUT", help="cProfile the base proxy first")
    p.add_argument("--child", metavar="SIM_URL", help=argparse.SUPPRESS)
    p.add_argument("--responses", help=argparse.SUPPRESS)
    args = p.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
