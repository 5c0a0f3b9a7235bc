"""What building one finished request's record costs on the loop that forwards streams.

``Exchange.to_record`` runs on the proxy's forwarding loop when a response ends (and the
bench client builds its records the same way on its measuring loop): every other stream
through that loop waits for it. QA saw 21–61 ms gaps in 10 ms-a-token probe streams when
32k–64k-event answers ended. This times ``to_record`` for long streams, with the engine's
usage equal to the events counted (no rescale) and one above it (the usual vLLM case: the
stop token is in usage but had no delta, so every chunk is rescaled), and the bench
client's ``_record`` for the same stream.

    python benchmarks/record_cost.py [--chunks 16384 65536] [--reps 7]

Figures: best and median wall time of ``--reps`` calls, in milliseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from array import array
from pathlib import Path
from time import perf_counter_ns

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmtop.bench.client import BenchClient, _Attempt
from llmtop.bench.workload import BenchRequest
from llmtop.events import ActiveRequest
from llmtop.proxy.relay import HOLD_AT, Exchange


class _Parser:
    """What ``to_record`` reads of a finished stream's parser."""

    def __init__(self, usage: int | None) -> None:
        self.usage_completion_tokens = usage
        self.usage_prompt_tokens = 37
        self.model = "m"
        self.response_id = None
        self.error = None


def _times(n: int, rng: random.Random, t0: int) -> list[int]:
    t = t0 + 20_000_000
    out = []
    for _ in range(n):
        t += 3_000_000 + rng.randint(0, 300_000)
        out.append(t)
    return out


def exchange(n: int, usage: int | None, rng: random.Random) -> Exchange:
    t0 = perf_counter_ns()
    a = ActiveRequest(id="r", user="u", model="m", dialect="openai",
                      path="/v1/chat/completions", stream=True, t_start=time.time(), t0_ns=t0)
    ex = Exchange(a)
    for t in _times(n, rng, t0):
        ex.offsets.append(t)
        ex.tokens.append(1)
        if len(ex.tokens) >= HOLD_AT:
            ex.hold()
    ex.end_ns = perf_counter_ns() + 10**10
    ex.stream = True
    ex.status = 200
    ex.parser = _Parser(usage)  # type: ignore[assignment]
    return ex


def attempt(n: int, usage: int | None, rng: random.Random, t0: int) -> _Attempt:
    at = _Attempt()
    at.status = 200
    at.offsets = array("q", _times(n, rng, t0))
    at.counts = array("q", [1] * n)
    at.parser = _Parser(usage)  # type: ignore[assignment]
    return at


def timed(f: object, reps: int) -> tuple[float, float]:
    assert callable(f)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append((time.perf_counter() - t) * 1e3)
    return min(out), statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(1)
    client = BenchClient("http://127.0.0.1:1")
    req = BenchRequest(prompt="p", prompt_tokens_target=1, max_tokens=1)
    print(f"{'what':62s} {'best ms':>9s} {'median ms':>10s}")
    for n in args.chunks:
        for label, usage in (("usage == counted", n), ("usage = counted + 1 (rescale)", n + 1)):
            ex = exchange(n, usage, rng)
            best, med = timed(ex.to_record, args.reps)
            print(f"{f'Exchange.to_record  {n:>6} chunks, {label}':62s} {best:9.2f} {med:10.2f}")
        for label, usage in (("usage == counted", n), ("usage = counted + 1 (rescale)", n + 1)):
            t0 = perf_counter_ns()
            at = attempt(n, usage, rng, t0)
            end = t0 + 10**11

            def rec(at: _Attempt = at, t0: int = t0, end: int = end) -> object:
                return client._record(t0, 0.0, end, "ok", None, at, req, 1)

            best, med = timed(rec, args.reps)
            print(f"{f'BenchClient._record {n:>6} chunks, {label}':62s} {best:9.2f} {med:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
