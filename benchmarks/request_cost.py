"""What does the proxy spend per request? CPU µs per short request, A/B interleaved.

Starts ``llmtop sim --firehose`` and one or more proxies in front of it (by default the
bare :class:`~llmtop.proxy.server.ProxyServer` in a small process of its own, as
``proxy_overhead.py --bare`` does; ``--headless``: ``llmtop run --headless``), then drives
each proxy in turn with the same closed load of short requests — N keep-alive
connections, each sending one request after another from a fixed mix: streaming chat
completions of 1 and 4 tokens and a non-streaming one (``--mix``) — and prints the
proxy's CPU time per completed request: the run time of every thread of its process
tree from ``/proc/.../schedstat`` (exact), divided by the requests it finished.

Per-chunk costs are small here by construction (1-4 content chunks plus the usage and
``[DONE]`` events a request), so the figure is mostly what the proxy spends on each
request: its head, the body rewrite for usage, the upstream request, the record.

``--variant ENV=VALUE`` (repeatable) adds proxies started with that environment variable
set, e.g. ``PYTHONPATH=/tmp/old`` after ``git archive REV llmtop | tar -x -C /tmp/old``
(every proxy runs with ``python -P``, so the current directory does not shadow it): phases
alternate between them (the order rotating each round), since this machine's
speed drifts more between two runs than most changes move the figure.

    python benchmarks/request_cost.py [--rounds 6] [--duration 2] [--conns 16]
        [--mix s1,s4,n4] [--headless] [--variant ENV=VALUE ...] [--profile OUT.prof]

``--profile OUT.prof`` runs the (bare) proxy under cProfile instead, drives it for
``--duration`` × ``--rounds`` seconds and writes the stats to ``OUT.prof``.

A proxy (the base or a variant) that does not start, or that completes no request in a
phase (every answer an HTTP error, connections refused, its process gone), measured
nothing: stderr says which and why (its exit code and last lines, the first error the
load generator saw), its line reads FAILED instead of a figure, and the run exits 3 once the
others are measured (0: every proxy carried requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (
    BARE_PROXY,
    EXIT_FAILED,
    Proc,
    Result,
    StartFailed,
    cpu_s,
    say_failed,
    why_nothing,
)

PROFILED_PROXY = BARE_PROXY.replace(
    "import uvloop\nuvloop.run(main())",
    "import cProfile, uvloop\n"
    "prof = cProfile.Profile()\n"
    "prof.enable()\n"
    "uvloop.run(main())\n"
    "prof.disable()\n"
    "prof.dump_stats(sys.argv[2])\n")


def _request(host: str, kind: str) -> bytes:
    """One request of the mix: ``s4`` streams 4 tokens, ``n1`` answers 1 token whole,
    with the headers the openai Python SDK sends."""
    stream, tokens = kind[0] == "s", int(kind[1:])
    body = json.dumps({"model": "m", "stream": stream, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "hi there"}]}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n".encode()
            + SDK_HEADERS + b"Content-Length: %d\r\n\r\n" % len(body) + body)


SDK_HEADERS = (
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"Accept: application/json\r\nContent-Type: application/json\r\n"
    b"User-Agent: OpenAI/Python 1.54.4\r\nX-Stainless-Lang: python\r\n"
    b"X-Stainless-Package-Version: 1.54.4\r\nX-Stainless-OS: Linux\r\n"
    b"X-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n"
    b"X-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer sk-bench-0123456789\r\n"
    b"X-Stainless-Async: false\r\nx-stainless-retry-count: 0\r\n")
"""What the openai Python SDK (httpx) sends besides Host and Content-Length."""


class Conn(asyncio.Protocol):
    """A keep-alive connection sending the mix's requests in turn until ``end``."""

    def __init__(self, requests: list[bytes], start: int, end: float,
                 counts: dict[str, int], done: asyncio.Future[None],
                 first_error: list[str]) -> None:
        self.requests, self.i, self.end = requests, start, end
        self.counts, self.done = counts, done
        self.first_error = first_error
        """The first error status line of the phase (shared; to say why nothing came)."""
        self.buf = b""
        self.need: int | None = None  # body bytes still due (Content-Length), or chunked
        self.in_body = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        if time.monotonic() >= self.end:
            self.transport.close()
            return
        self.buf, self.in_body, self.need = b"", False, None
        self.transport.write(self.requests[self.i % len(self.requests)])
        self.i += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.in_body:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i].lower()
            if not head.startswith(b"http/1.1 200"):
                self.counts["errors"] += 1
                if not self.first_error:
                    self.first_error.append(
                        self.buf[:i].partition(b"\r\n")[0].decode("latin-1")[:120])
                assert self.transport is not None
                self.transport.close()
                return
            self.in_body = True
            j = head.find(b"content-length:")
            if j >= 0:
                self.need = int(head[j + 15:].split(b"\r\n", 1)[0])
            self.buf = self.buf[i + 4:]
        if self.need is not None:
            if len(self.buf) < self.need:
                return
        elif not self.buf.endswith(b"0\r\n\r\n"):
            return
        self.counts["requests"] += 1
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts["open"] -= 1
        if self.counts["open"] == 0 and not self.done.done():
            self.done.set_result(None)


async def drive(url: str, conns: int, mix: list[str], duration: float,
                first_error: list[str] | None = None) -> dict[str, int]:
    """``conns`` connections sending the mix for ``duration`` s: requests completed and
    errors (a refused connection is one); the first error's words go to ``first_error``."""
    hostport = url.removeprefix("http://")
    host, port = hostport.rsplit(":", 1)
    requests = [_request(hostport, k) for k in mix]
    loop = asyncio.get_running_loop()
    counts = {"requests": 0, "errors": 0, "open": conns}
    seen = first_error if first_error is not None else []
    done: asyncio.Future[None] = loop.create_future()
    end = time.monotonic() + duration
    for c in range(conns):
        try:
            await loop.create_connection(
                lambda c=c: Conn(requests, c, end, counts, done, seen),  # type: ignore[misc]
                host, int(port))
        except OSError as exc:
            counts["open"] -= 1
            counts["errors"] += 1
            if not seen:
                seen.append(f"connecting to {hostport}: "
                            + (os.strerror(exc.errno) if exc.errno else str(exc)))
    if counts["open"] == 0 and not done.done():
        done.set_result(None)
    await done
    return counts


async def amain(args: argparse.Namespace) -> int:
    py = sys.executable
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1"}
    mix = args.mix.split(",")
    try:
        sim = Proc([py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1",
                    "--firehose"], "llmtop: sim listening on ", env)
    except StartFailed as exc:  # nothing to measure
        say_failed("start", "the simulator", str(exc), "request_cost")
        return EXIT_FAILED
    procs: list[Proc] = []
    try:
        if args.profile:
            prox = Proc([py, "-P", "-c", PROFILED_PROXY, sim.url, args.profile],
                        "llmtop: proxy listening on ", env)
            procs.append(prox)
            await drive(prox.url, args.conns, mix, 1.0)  # warm
            cpu0 = cpu_s(prox.pids)
            counts = await drive(prox.url, args.conns, mix, args.duration * args.rounds)
            cpu = cpu_s(prox.pids) - cpu0
            print(f"profiled: {counts['requests']} requests, "
                  f"{cpu / max(1, counts['requests']) * 1e6:.0f} µs each (with cProfile)")
            return 0

        def start(extra: dict[str, str]) -> Proc:
            if args.headless:
                cmd = [py, "-P", "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
                       "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
            else:
                cmd = [py, "-P", "-c", BARE_PROXY, sim.url]
            return Proc(cmd, "llmtop: proxy listening on ", {**env, **extra})

        names = ["base", *args.variant]
        failed: dict[str, str] = {}
        """The proxies that measured nothing (did not start, or a phase without a
        completed request), and why."""
        running: dict[str, Proc] = {}
        for name in names:
            key, _, value = name.partition("=")
            try:
                running[name] = start({key: value} if name != "base" else {})
            except StartFailed as exc:
                failed[name] = str(exc)
                say_failed("start", name, failed[name], "request_cost")
                continue
            procs.append(running[name])
        for p in procs:
            await drive(p.url, args.conns, mix, 1.0)  # warm up: pool, caches
        per: dict[str, list[float]] = {n: [] for n in names}
        errors = 0
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                if name in failed:
                    continue
                p = running[name]
                pids = p.pids
                cpu0 = cpu_s(pids)
                first_error: list[str] = []
                counts = await drive(p.url, args.conns, mix, args.duration, first_error)
                cpu = cpu_s(pids) - cpu0
                errors += counts["errors"]
                if counts["requests"] == 0:  # no figure: CPU over nothing
                    seen = Result(name, args.conns, errors=counts["errors"],
                                  first_error=first_error[0] if first_error else None)
                    failed[name] = why_nothing(seen, p)
                    say_failed(f"round {r}", name, failed[name], "request_cost")
                    continue
                us = cpu / counts["requests"] * 1e6
                per[name].append(us)
                print(f"  round {r} {name}: {counts['requests']} requests, "
                      f"{us:.1f} µs/request", flush=True)
                await asyncio.sleep(0.2)
        print(f"\nproxy CPU per request ({'llmtop run --headless' if args.headless else 'bare'}"
              f", {args.conns} connections, mix {args.mix}, {args.rounds} rounds of "
              f"{args.duration:g} s{', errors ' + str(errors) if errors else ''}):")
        base = statistics.median(per["base"]) if "base" not in failed else None
        for n in names:
            if n in failed:
                print(f"  {n:>28}: FAILED: {failed[n]}")
                continue
            med = statistics.median(per[n])
            print(f"  {n:>28}: median {med:6.1f} µs  mean {statistics.fmean(per[n]):6.1f}"
                  f"  min {min(per[n]):6.1f}"
                  + (f"  ({med / base - 1:+.1%} vs base)" if base else ""))
        if failed:
            print(f"request_cost: FAILED: {', '.join(failed)} measured nothing; no figure "
                  f"for it (exit {EXIT_FAILED})", file=sys.stderr)
            return EXIT_FAILED
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        sim.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"Exit status: 0 when every proxy carried requests; "
                                f"{EXIT_FAILED} when one measured nothing (did not start, or "
                                "no request completed in a phase: its line reads FAILED and "
                                "stderr says why).")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per phase")
    p.add_argument("--conns", type=int, default=16, help="concurrent connections")
    p.add_argument("--mix", default="s1,s4,n4",
                   help="request kinds in turn: sN streams N tokens, nN answers N whole")
    p.add_argument("--headless", action="store_true", help="llmtop run --headless")
    p.add_argument("--variant", action="append", default=[], metavar="ENV=VALUE")
    p.add_argument("--profile", metavar="OUT.prof", help="cProfile the bare proxy")
    return asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
