"""What the metrics side costs: recorded values per second, and snapshot build time.

1. Recording: batches of finished-request records (as the bus delivers them every 50 ms)
   go through ``Aggregator.on_events``; a value is one latency sample put into the
   histograms (TTFT, each ITL sample, each chunk gap, TPOT, E2E), each recorded to the
   system, user and model series. Target: ≥ 100,000 values/s on one core.
2. Snapshots: an aggregator holding 5+ minutes of traffic from 100 users (top_users=100)
   builds its snapshot for every window (10, 60, 300, all). Target: ≤ 5 ms each.
   Also shown: the snapshot with per-user histograms, and a Prometheus scrape (``GET
   /metrics``: reading the aggregator and writing the text, in both formats; beside it
   the same bytes through prometheus_client's own encoder, what the direct writer
   replaces).

    python benchmarks/metrics_cost.py [--users 100] [--tokens 200] [--rate 20]

Single process, single thread; times are this thread's CPU time (``time.thread_time``),
which a busy shared machine inflates less than wall time (shown too). numpy's work is
included (SIMD, no extra threads for these operations).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.exposition import choose_encoder

from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import LlmtopCollector, make_registry


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_record(i: int, rng: random.Random, users: int, tokens: int, t: float) -> RequestRecord:
    ttft = rng.lognormvariate(-2.0, 0.6)
    offs = [ttft]
    n_chunks = max(2, int(rng.gauss(tokens, tokens / 5)))
    for _ in range(n_chunks - 1):
        offs.append(offs[-1] + rng.lognormvariate(-3.7, 0.35))
    outcome = "ok" if rng.random() > 0.02 else rng.choice(["error", "cancelled", "timeout"])
    return RequestRecord(
        id=f"r{i}", user=f"user-{rng.randrange(users):03d}", model=rng.choice(["a", "b"]),
        dialect="openai", path="/v1/chat/completions", stream=True, status=200,
        outcome=outcome,  # type: ignore[arg-type]
        t_start=t - offs[-1], ttft_s=ttft, e2e_s=offs[-1] + 0.0005,
        prompt_tokens=rng.randrange(50, 2000), completion_tokens=n_chunks,
        token_source="usage", chunk_offsets_s=tuple(offs), chunk_tokens=(1,) * n_chunks,
        concurrency_at_start=rng.randrange(1, 64),
    )


def values_in(r: RequestRecord) -> int:
    n = len(r.chunk_offsets_s)
    return 1 + 2 * (n - 1) + (2 if r.outcome == "ok" else 0)


def bench_recording(users: int, tokens: int) -> tuple[float, int, float]:
    rng = random.Random(1)
    clock = Clock(1_796_000_000.0)
    agg = Aggregator(Config(top_users=users), clock=clock)
    batches = [[make_record(b * 50 + i, rng, users, tokens, clock.t) for i in range(50)]
               for b in range(40)]
    n_values = sum(values_in(r) for b in batches for r in b)
    t0 = time.thread_time()
    for b in batches:
        clock.t += 0.05
        agg.on_events(b)
    dt = time.thread_time() - t0
    return n_values / dt, n_values, dt


def filled_aggregator(users: int, tokens: int, rate: float, seconds: float) -> Aggregator:
    rng = random.Random(2)
    clock = Clock(1_796_000_000.0)
    active: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(top_users=users), active, clock=clock)
    i = 0
    steps = int(seconds / 0.5)
    for _ in range(steps):
        clock.t += 0.5
        batch = [make_record(i + k, rng, users, tokens, clock.t)
                 for k in range(rng.randrange(0, int(2 * rate * 0.5) + 1))]
        i += len(batch)
        agg.on_events(batch)
        agg.tick()
    # some requests in flight when the snapshot is taken
    for k in range(64):
        rid = f"a{k}"
        active[rid] = ActiveRequest(rid, f"user-{k % users:03d}", "a", "openai", "/v1", True,
                                    clock.t - 1, time.perf_counter_ns() - 10**9,
                                    first_token_ns=None if k % 4 else time.perf_counter_ns(),
                                    tokens=k)
    agg.tick()
    return agg


def time_ms(fn: object, repeat: int = 30) -> tuple[float, float, float]:
    """(median wall ms, median and minimum CPU ms of this thread) over ``repeat`` calls."""
    assert callable(fn)
    fn()  # warm
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(wall), statistics.median(cpu), min(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=200, help="mean output tokens per request")
    ap.add_argument("--rate", type=float, default=20.0, help="requests/s while filling")
    ap.add_argument("--seconds", type=float, default=330.0, help="traffic history to fill")
    args = ap.parse_args()

    vps, n, dt = bench_recording(args.users, args.tokens)
    print(f"recording: {n:,} values in {dt * 1e3:.0f} ms CPU -> {vps:,.0f} values/s "
          f"(target >= 100,000)")

    agg = filled_aggregator(args.users, args.tokens, args.rate, args.seconds)
    snap = agg.snapshot(300)
    print(f"history: {agg.records_seen:,} requests from {len(snap['users'])} user rows, "
          f"{args.seconds:.0f} s; window 300 table {len(agg.view(300).table):,} entries")
    worst = 0.0
    for w in (10, 60, 300, None):
        wall, cpu, best = time_ms(lambda w=w: agg.snapshot(w))
        worst = max(worst, cpu)
        size = len(json.dumps(agg.snapshot(w)))
        print(f"snapshot window={w!s:>4}: CPU median {cpu:5.2f} ms, min {best:5.2f} ms "
              f"(wall median {wall:5.2f} ms), {size / 1024:.0f} KiB JSON")
    print(f"snapshot, worst window: median {worst:.2f} ms CPU (target <= 5 ms)")
    wall, cpu, best = time_ms(lambda: json.dumps(agg.snapshot(60)), repeat=10)
    print(f"snapshot window=60 + json.dumps: CPU median {cpu:.2f} ms, min {best:.2f} ms")
    wall, cpu, best = time_ms(lambda: agg.snapshot(60, user_histograms=True), repeat=5)
    print(f"snapshot window=60 with per-user histograms (opt-in): CPU median {cpu:.1f} ms")
    col = LlmtopCollector(agg)
    reg = make_registry(agg)
    for fmt, accept in (("text", ""), ("OpenMetrics", "application/openmetrics-text")):
        body = col.exposition(accept)[0]
        # the same bytes as prometheus_client's encoder of the same families
        assert body == choose_encoder(accept)[0](reg), fmt
        wall, cpu, best = time_ms(lambda a=accept: col.exposition(a), repeat=10)
        fam_cpu = time_ms(col.families, repeat=10)[1]
        print(f"prometheus scrape ({fmt}): CPU median {cpu:.1f} ms, min {best:.1f} ms "
              f"(reading the aggregator {fam_cpu:.1f} ms), {len(body) / 1024:.0f} KiB")
        wall, cpu, best = time_ms(lambda a=accept: choose_encoder(a)[0](reg), repeat=5)
        print(f"  same bytes through prometheus_client (collect + its encoder): "
              f"CPU median {cpu:.1f} ms, min {best:.1f} ms")
    c0 = time.thread_time()
    sum(range(10**6))
    ref = (time.thread_time() - c0) * 1e3
    print(f"calibration: sum(range(10**6)) took {ref:.1f} ms CPU on this machine now "
          f"(about 10 ms on an unloaded recent x86 core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
