"""What the saturation detectors cost: per finished request (``on_events``) and per tick.

``llmtop run`` evaluates the detectors once a second on the proxy's event loop, so a tick
must stay short at any request rate (target: ≤ 20 ms at 200 requests/s of 100-token
streams; a third of the prompts long, so PREFILL_INTERFERENCE does its coincidence work),
and ingesting a record must stay far below its forwarding cost.

    python benchmarks/saturation_cost.py [--rates 10,50,200] [--tokens 100] [--seconds 70]

Synthetic records on a virtual clock (default config: 10-s window, 60-s long window).
Times are this thread's CPU time (``time.thread_time``), which a busy shared machine
inflates less than wall time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmtop.config import load_config
from llmtop.events import ActiveRequest, EngineReading, Event, GpuReading, RequestRecord
from llmtop.saturation import SaturationMonitor


def record(i: int, rng: random.Random, t_end: float, tokens: int) -> RequestRecord:
    gaps = [rng.lognormvariate(-3.9, 0.3) for _ in range(tokens - 1)]
    offs = [rng.lognormvariate(-2.5, 0.5)]
    for g in gaps:
        offs.append(offs[-1] + g)
    bad = rng.random() < 0.01
    return RequestRecord(
        id=f"r{i}", user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=500 if bad else 200, outcome="error" if bad else "ok",
        t_start=t_end - offs[-1], ttft_s=None if bad else offs[0], e2e_s=offs[-1],
        prompt_tokens=rng.choice((60, 80, 3000)), completion_tokens=tokens,
        token_source="usage", chunk_offsets_s=tuple(offs), chunk_tokens=(1,) * tokens,
    )


def run(rate: int, tokens: int, seconds: int) -> tuple[float, float, float, int]:
    """(µs per record ingested, median ms per tick, max ms per tick, records kept)."""
    mon = SaturationMonitor(load_config(None, env={}), lambda e: None,
                            {f"a{i}": ActiveRequest(id=f"a{i}", user="u", model="m",
                                                     dialect="openai", path="/", stream=True,
                                                     t_start=0.0, t0_ns=0)
                             for i in range(rate // 4)})
    rng = random.Random(rate)
    now = 1.8e9
    feed_s = 0.0
    fed = 0
    ticks: list[float] = []
    for _ in range(seconds):
        now += 1.0
        batch: list[Event] = [record(fed + i, rng, now - 1.0 + i / rate, tokens)
                              for i in range(rate)]
        batch.append(GpuReading(t=now, index=0, name="g", mem_used_bytes=50,
                                mem_total_bytes=100, dram_bw_util=60.0))
        batch.append(EngineReading(t=now, kind="vllm", running=rate // 4, waiting=0,
                                   kv_cache_usage=0.5, preemptions=0))
        t0 = time.thread_time()
        mon.on_events(batch)
        feed_s += time.thread_time() - t0
        fed += rate
        t0 = time.thread_time()
        mon.tick(now, int(now * 1e9))
        ticks.append(time.thread_time() - t0)
    steady = ticks[len(ticks) // 2:]
    return (feed_s / fed * 1e6, statistics.median(steady) * 1e3, max(steady) * 1e3,
            len(mon.signals.finished))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,50,200", help="requests/s to try")
    ap.add_argument("--tokens", type=int, default=100, help="chunks per request")
    ap.add_argument("--seconds", type=int, default=70, help="virtual seconds per rate")
    args = ap.parse_args()
    print(f"saturation_cost: {args.tokens}-token streams, {args.seconds} s per rate "
          "(thread CPU time)")
    for rate in (int(r) for r in args.rates.split(",")):
        per_rec, med, worst, kept = run(rate, args.tokens, args.seconds)
        print(f"  {rate:>5} req/s: ingest {per_rec:6.1f} µs/record, tick {med:6.2f} ms "
              f"(max {worst:6.2f} ms), {kept} records kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
