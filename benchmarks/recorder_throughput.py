"""How fast the recorder writes, and what it costs the event loop.

Prints, for .jsonl and .jsonl.gz:
- the cost of ``Recorder.on_events`` per event on the event loop (the only recorder work
  the proxy's loop ever does), with room in the queue and with the queue full (drops);
- the lines per second the writer thread sustains (serialise + write + flush) — the
  traffic above which a recording starts dropping lines instead of stalling streams;
- the lines per second the reader reads back (what bounds ``llmtop report`` / ``export``).

    .venv/bin/python benchmarks/recorder_throughput.py [--events 100000] [--chunks 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder


def make_records(n: int, chunks: int) -> list[RequestRecord]:
    offs = tuple(0.05 + 0.012 * k for k in range(chunks))
    toks = tuple(1 for _ in range(chunks))
    now = time.time()  # the reader drops requests more than a day before the recording began
    return [
        RequestRecord(
            id=f"req-{i:08d}", user=f"user{i % 50}", model="meta-llama/Llama-3.1-8B-Instruct",
            dialect="openai", path="/v1/chat/completions", stream=True, status=200,
            outcome="ok", t_start=now + i * 0.01, ttft_s=0.05, e2e_s=offs[-1] + 0.001,
            prompt_tokens=512, completion_tokens=chunks, token_source="usage",
            chunk_offsets_s=offs, chunk_tokens=toks, concurrency_at_start=i % 64,
        )
        for i in range(n)
    ]


def bench(path: Path, records: list[RequestRecord], batch: int) -> dict[str, float]:
    n = len(records)
    rec = Recorder(path, header={"upstream": "bench"}, queue_max=n + 1, flush_s=1.0)
    rec.start()
    t0 = time.perf_counter()
    enqueue = 0.0
    for i in range(0, n, batch):
        t = time.perf_counter()
        rec.on_events(records[i:i + batch])
        enqueue += time.perf_counter() - t
    while rec.status()["lines"] < n + 1:
        time.sleep(0.01)
    written = time.perf_counter() - t0
    st = rec.stop()

    full = Recorder(path.with_suffix(".full" + path.suffix), header={}, queue_max=1,
                    flush_s=60.0)
    full.start()
    full.on_events(records[:1])
    t = time.perf_counter()
    for i in range(0, n, batch):
        full.on_events(records[i:i + batch])
    drop_cost = time.perf_counter() - t
    full.stop()

    t = time.perf_counter()
    with RecordingReader(path) as r:
        read = sum(1 for _ in r)
    read_s = time.perf_counter() - t
    assert read == n
    return {
        "enqueue_ns_per_event": enqueue / n * 1e9,
        "drop_ns_per_event": drop_cost / n * 1e9,
        "lines_per_s": n / written,
        "mb_per_s": st["bytes"] / written / 1e6,
        "bytes_per_line": st["bytes"] / (n + 2),
        "read_lines_per_s": n / read_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--chunks", type=int, default=32, help="content chunks per request")
    ap.add_argument("--batch", type=int, default=100, help="events per bus batch")
    args = ap.parse_args()
    records = make_records(args.events, args.chunks)
    print(f"recorder: {args.events:,} request records, {args.chunks} chunks each, "
          f"batches of {args.batch}")
    with tempfile.TemporaryDirectory() as d:
        for suffix in (".jsonl", ".jsonl.gz"):
            r = bench(Path(d) / f"bench{suffix}", records, args.batch)
            print(
                f"  {suffix:<10} on_events {r['enqueue_ns_per_event']:7.0f} ns/event "
                f"(queue full: {r['drop_ns_per_event']:5.0f} ns/event) · writer "
                f"{r['lines_per_s']:9,.0f} lines/s ({r['mb_per_s']:5.1f} MB/s on disk, "
                f"{r['bytes_per_line']:.0f} B/line) · reader {r['read_lines_per_s']:9,.0f} "
                "lines/s"
            )


if __name__ == "__main__":
    main()
