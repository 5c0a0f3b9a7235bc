"""Goodput is counted when a request finishes; output tokens/s as the tokens stream.

QA: a 20 s answer that met every SLO showed goodput 95 tok/s against output 50 tok/s in
the 10 s window (its whole answer was credited at its end, while output tokens/s counted
only the tokens streamed in the window). Both are right; ``finished_output_tps`` (the
output tokens of the requests that finished in the window) is the figure goodput is a
share of, so goodput_tps <= finished_output_tps always.
"""

from __future__ import annotations

from metrics_records import Clock, open_stream, record

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.merge import merge_snapshots

RATE = 50  # tokens a second, one a chunk
SECONDS = 20


def long_answer(agg: Aggregator, reg: dict[str, ActiveRequest], clock: Clock,
                user: str) -> int:
    a = open_stream(reg, f"r-{user}", user, clock.t)
    t_start = clock.t
    for _ in range(SECONDS * 2):
        clock.advance(0.5)
        a.tokens += RATE // 2
        a.chunks += RATE // 2
        agg.tick()
    n = a.tokens
    del reg[a.id]
    agg.on_events([record(rid=a.id, user=user, t_start=t_start, ttft=0.02,
                          gaps=[(SECONDS - 0.05) / n] * (n - 1), completion_tokens=n)])
    return n


def test_goodput_is_a_share_of_finished_output_not_of_streamed_output() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    n = long_answer(agg, reg, clock, "alice")
    clock.advance(0.1)
    agg.tick()
    sy = agg.snapshot(10)["system"]
    assert sy["slo_met"] == 1
    # the whole answer finished in the window; only its last 10 s streamed in it
    assert sy["finished_output_tps"] * sy["span_s"] == n
    assert sy["goodput_tps"] == sy["finished_output_tps"]
    assert sy["goodput_tps"] > 1.5 * sy["output_tps"]
    user = next(u for u in agg.snapshot(10)["users"] if u["user"] == "alice")
    assert user["finished_output_tps"] == sy["finished_output_tps"]

    # merged (workers, attach to several proxies): summed like the other rates
    merged = merge_snapshots([agg.snapshot(10), agg.snapshot(10)])
    assert merged["system"]["finished_output_tps"] == 2 * sy["finished_output_tps"]
    assert merged["users"][0]["finished_output_tps"] == 2 * user["finished_output_tps"]
