"""How many chunks per second can the simulator push in firehose mode on this machine?

Starts ``llmtop sim --firehose`` in its own process, opens N concurrent keep-alive
connections that each issue streaming chat requests back to back for a fixed duration,
and prints chunks/s and requests/s as the clients counted them, the engine's own
generated tokens/s from ``/metrics``, and the simulator's CPU time per chunk.

The load generator is a bare asyncio protocol (it only counts content chunks and spots
the end of each chunked response) so that it costs much less CPU than the simulator it
measures; an aiohttp client would be the bottleneck on a small machine.

    python benchmarks/sim_firehose.py [--streams 64] [--duration 5] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from typing import cast
from urllib.parse import urlsplit

import aiohttp

CONTENT = b'"content":"'
END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked HTTP/1.1 body
TAIL = len(CONTENT) - 1


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Counts:
    chunks = 0
    requests = 0


class StreamClient(asyncio.Protocol):
    """One keep-alive connection issuing the same streaming request until ``stop_at``."""

    def __init__(self, request: bytes, stop_at: float, counts: Counts,
                 done: asyncio.Future[None]) -> None:
        self.request = request
        self.stop_at = stop_at
        self.counts = counts
        self.done = done
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buf = self.tail + data
        self.counts.chunks += buf.count(CONTENT)
        if buf.endswith(END):
            self.counts.requests += 1
            self.tail = b""
            assert self.transport is not None
            if time.perf_counter() < self.stop_at:
                self.transport.write(self.request)
            else:
                self.transport.close()
        else:
            self.tail = buf[-TAIL:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _load(url: str, streams: int, max_tokens: int, duration: float, counts: Counts
                ) -> float:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": max_tokens, "stream": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    futures = []
    for _ in range(streams):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(
            lambda d=done: StreamClient(request, t0 + duration, counts, d), host, port)
        futures.append(done)
    await asyncio.gather(*futures)
    return time.perf_counter() - t0


async def _metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith((name + "{", name + " ")):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def run(streams: int, duration: float, max_tokens: int, profile: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "sim", "--firehose", "--listen", "127.0.0.1:0",
        "--profile", profile, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode().strip()
    url = line.rsplit(" ", 1)[-1]
    try:
        await _load(url, min(streams, 8), 16, 0.5, Counts())  # warm-up
        tokens0 = await _metric(url, "vllm:generation_tokens_total")
        cpu0 = _cpu_seconds(proc.pid)
        counts = Counts()
        elapsed = await _load(url, streams, max_tokens, duration, counts)
        cpu1 = _cpu_seconds(proc.pid)
        tokens1 = await _metric(url, "vllm:generation_tokens_total")
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"llmtop sim --firehose ({profile}): {streams} concurrent streams, "
          f"max_tokens {max_tokens}, {elapsed:.1f} s")
    print(f"  client-counted:   {counts.chunks / elapsed:,.0f} chunks/s, "
          f"{counts.requests / elapsed:,.1f} requests/s ({counts.chunks:,} chunks, "
          f"{counts.requests:,} requests)")
    print(f"  engine-generated: {(tokens1 - tokens0) / elapsed:,.0f} tokens/s "
          f"(one token per chunk)")
    if cpu0 is not None and cpu1 is not None and counts.chunks:
        per_chunk = (cpu1 - cpu0) / counts.chunks
        print(f"  simulator CPU:    {cpu1 - cpu0:.2f} s of {elapsed:.1f} s = "
              f"{per_chunk * 1e6:.0f} µs per chunk → ≈{1 / per_chunk:,.0f} chunks/s "
              f"on one free core")
    print(f"  machine: {os.cpu_count()} CPUs, load average {load:.1f} at the end, "
          f"Python {platform.python_version()}; the load generator shares the CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--streams", type=int, default=64, help="concurrent clients (64)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds to measure (5)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per request (256)")
    ap.add_argument("--profile", default="h200-llama8b", help="sim profile (h200-llama8b)")
    args = ap.parse_args()
    coro = run(args.streams, args.duration, args.max_tokens, args.profile)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    main()
