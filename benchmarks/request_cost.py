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
from proxy_overhead import BARE_PROXY, Proc, cpu_s

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
                 counts: dict[str, int], done: asyncio.Future[None]) -> None:
        self.requests, self.i, self.end = requests, start, end
        self.counts, self.done = counts, done
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


async def drive(url: str, conns: int, mix: list[str], duration: float) -> dict[str, int]:
    hostport = url.removeprefix("http://")
    host, port = hostport.rsplit(":", 1)
    requests = [_request(hostport, k) for k in mix]
    loop = asyncio.get_running_loop()
    counts = {"requests": 0, "errors": 0, "open": conns}
    done: asyncio.Future[None] = loop.create_future()
    end = time.monotonic() + duration
    for c in range(conns):
        await loop.create_connection(
            lambda c=c: Conn(requests, c, end, counts, done), host, int(port))  # type: ignore[misc]
    await done
    return counts


async def amain(args: argparse.Namespace) -> int:
    py = sys.executable
    env = {**os.environ, "LLMTOP_GPU_SOURCE": "none", "PYTHONUNBUFFERED": "1"}
    mix = args.mix.split(",")
    sim = Proc([py, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0", "--seed", "1",
                "--firehose"], "llmtop: sim listening on ", env)
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
        for v in args.variant:
            key, _, value = v.partition("=")
            procs.append(start({key: value}))
        procs.insert(0, start({}))
        for p in procs:
            await drive(p.url, args.conns, mix, 1.0)  # warm up: pool, caches
        per: dict[str, list[float]] = {n: [] for n in names}
        errors = 0
        for r in range(args.rounds):
            order = list(range(len(procs)))
            order = order[r % len(order):] + order[: r % len(order)]
            for k in order:
                p = procs[k]
                pids = p.pids
                cpu0 = cpu_s(pids)
                counts = await drive(p.url, args.conns, mix, args.duration)
                cpu = cpu_s(pids) - cpu0
                errors += counts["errors"]
                us = cpu / max(1, counts["requests"]) * 1e6
                per[names[k]].append(us)
                print(f"  round {r} {names[k]}: {counts['requests']} requests, "
                      f"{us:.1f} µs/request", flush=True)
                await asyncio.sleep(0.2)
        print(f"\nproxy CPU per request ({'llmtop run --headless' if args.headless else 'bare'}"
              f", {args.conns} connections, mix {args.mix}, {args.rounds} rounds of "
              f"{args.duration:g} s{', errors ' + str(errors) if errors else ''}):")
        base = statistics.median(per["base"])
        for n in names:
            med = statistics.median(per[n])
            print(f"  {n:>28}: median {med:6.1f} µs  mean {statistics.fmean(per[n]):6.1f}"
                  f"  min {min(per[n]):6.1f}  ({med / base - 1:+.1%} vs base)")
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        sim.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
