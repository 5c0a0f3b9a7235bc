"""Throughput of the OpenAI stream parser (and the usage stripper) on the forwarding path.

Feeds the real llama.cpp capture (tests/fixtures/dialects/llamacpp_chat_stream_usage.sse)
the way the relay sees it — one read per SSE event — and also as one read per body, then
prints events/s, MB/s and µs per read (fastest of many ~10 ms batches, CPU time).
Single-threaded, no I/O. The last line is the whole per-read Python of the forwarding path
with the caches warm: the upstream connection's ``data_received`` given one chunked frame
("SIZE\r\nEVENT\r\n") per read, the relay's ``on_data`` (the usage stripper, the chunk's
time, re-framing, a write to a transport that takes it, the parser, the bookkeeping) —
the real objects, a stand-in transport. In a running proxy the same path costs about
twice as much (cold caches across many connections; measured with perf, see the notes).

    .venv/bin/python benchmarks/parser_throughput.py [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmtop.events import ActiveRequest
from llmtop.proxy.dialects.openai import OpenAIStreamParser, UsageChunkStripper
from llmtop.proxy.dialects.sse import SSEFramer
from llmtop.proxy.relay import Exchange, RelaySink, Watchdog, WatchdogSweeper
from llmtop.proxy.upstream import UpstreamConnection, UpstreamPool

FIXTURE = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "dialects"
           / "llamacpp_chat_stream_usage.sse")


def measure(label: str, reads: list[bytes], run_once: Callable[[list[bytes]], None],
            seconds: float) -> None:
    """The fastest of many short batches (as ``timeit`` does), in CPU time: on a shared
    machine other processes only ever make a batch slower, so the minimum is the figure
    closest to the code's own cost."""
    n_events = sum(r.count(b"\n\n") for r in reads)
    n_bytes = sum(len(r) for r in reads)
    run_once(reads)  # warm-up
    t0 = time.process_time()
    rounds = 0
    while time.process_time() - t0 < 0.01:  # a batch of about 10 ms
        run_once(reads)
        rounds += 1
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.process_time()
        for _ in range(rounds):
            run_once(reads)
        best = min(best, time.process_time() - t0)
    ev_s = rounds * n_events / best
    mb_s = rounds * n_bytes / best / 1e6
    us_read = best / (rounds * len(reads)) * 1e6
    print(f"{label:<42} {ev_s:>10,.0f} events/s {mb_s:>7.1f} MB/s {us_read:>7.2f} µs/read")


def parse(reads: list[bytes]) -> None:
    p = OpenAIStreamParser()
    for r in reads:
        p.feed(r)
    p.finish()


def frame(reads: list[bytes]) -> None:
    f = SSEFramer()
    for r in reads:
        f.feed(r)
    f.finish()


def strip(reads: list[bytes]) -> None:
    s = UsageChunkStripper()
    for r in reads:
        s.filter(r)
    s.flush()


class _Transport:
    """Takes every write at once, as a socket with room does."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Client:
    writing_paused = False


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def relay(reads: list[bytes]) -> None:
    """One response through UpstreamConnection → RelaySink, as the proxy wires them."""
    loop = asyncio.get_running_loop()
    conn = UpstreamConnection(UpstreamPool("http://127.0.0.1:1", 1.0))
    t = _Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
    conn.data_received(HEAD)
    active = ActiveRequest(id="b", user="u", model="m", dialect="openai", path="/",
                           stream=True, t_start=0.0, t0_ns=0)
    ex = Exchange(active)
    wd = Watchdog(_Client(), WatchdogSweeper(1.0))  # type: ignore[arg-type]
    sink = RelaySink(ex, OpenAIStreamParser(), UsageChunkStripper(), t,  # type: ignore[arg-type]
                     b"", True, _Client(), None, conn, wd, loop)  # type: ignore[arg-type]
    conn.attach(sink)
    feed = conn.data_received
    for r in reads:
        feed(r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = ap.parse_args()
    raw = FIXTURE.read_bytes()
    per_event = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    whole = [raw]
    print(f"fixture: {FIXTURE.name}: {len(raw)} bytes, {len(per_event)} events "
          f"(mean {len(raw) / len(per_event):.0f} B/event)")
    measure("OpenAIStreamParser, one read per event", per_event, parse, args.seconds)
    content = [e for e in per_event if b'"content":"' in e and b'"content":""' not in e]
    steady = per_event[:1] + content * 20  # a long answer: role chunk, then text chunks
    measure("OpenAIStreamParser, long answer, per event", steady, parse, args.seconds)
    measure("OpenAIStreamParser, one read per body", whole, parse, args.seconds)
    measure("SSEFramer alone, one read per event", per_event, frame, args.seconds)
    measure("UsageChunkStripper, one read per event", per_event, strip, args.seconds)
    measure("UsageChunkStripper, long answer, per event", steady, strip, args.seconds)
    # 500 chunks a response: the per-response set-up (connection, head, parser) is
    # then ~1% of the figure
    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in per_event[:1] + content * 500]

    # a busy upstream (firehose) or a slow reader: several whole chunks in one read
    fours = [b"".join(frames[i:i + 4]) for i in range(0, len(frames), 4)]

    async def forwarding() -> None:
        measure("forwarding path (relay), long answer, per read", frames, relay,
                args.seconds)
        measure("forwarding path (relay), 4 chunks per read, per read", fours, relay,
                args.seconds)

    asyncio.run(forwarding())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
