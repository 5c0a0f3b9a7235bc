"""QA: a proxy left running for weeks (``llmtop run --headless`` with ``attach`` and
Prometheus reading it) stays bounded. The real aggregator, snapshot and /metrics
collector with an injected clock, simulated days apart: nothing may grow with the time
run or with the distinct requests, users and models seen.

The week of traffic is scaled down in rate (100 requests per 10 simulated minutes) to keep
the test short; what could grow with time grows per distinct id and per interval, which
it still sees: users drawn from 200,000 ids (some 100,000 distinct seen, each active for
about 100 minutes, then gone), 50 models, a
request every tick whose record never comes."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

from metrics_records import Clock, record

from llmtop.config import Config
from llmtop.events import ActiveRequest, ChunkSlice
from llmtop.metrics.aggregator import _LIVE_FORGET_S, Aggregator
from llmtop.metrics.prometheus import LlmtopCollector
from llmtop.workers import FleetActive

DAY = 86_400.0
STEP_S = 600.0
PER_STEP = 100
STEPS_PER_DAY = int(DAY / STEP_S)
WEEK = 7 * STEPS_PER_DAY
USERS = 200_000
MODELS = 50
USER_WINDOW = 1_000
"""Users active at a time: each one's requests span about ten steps."""
LATENCIES = [0.001 * 1.07 ** k for k in range(120)]
"""TTFTs and gaps cycled through: the histograms see a wide spread of values early on."""

PER_REQUEST = ("_live", "_live_seen", "_itl_live", "_scored", "_ttft_filed")


def _open(rid: str, user: str, model: str, t: float, t0_ns: int) -> ActiveRequest:
    return ActiveRequest(id=rid, user=user, model=model, dialect="openai",
                         path="/v1/chat/completions", stream=True, t_start=t, t0_ns=t0_ns,
                         first_token_ns=t0_ns + 10**8, chunks=12, tokens=12)


def _measure(agg: Aggregator, col: LlmtopCollector) -> dict[str, Any]:
    gc.collect()
    out: dict[str, Any] = {
        "snapshot_all": len(json.dumps(agg.snapshot(None, user_histograms=True))),
        "snapshot_60": len(json.dumps(agg.snapshot(60))),
        "metrics": len(col.exposition()[0]),
        "all_keys": len(agg.view(None).table),
        "users.scores": len(agg.users.scores),
        "models.scores": len(agg.models.scores),
        "tokens_per_event": len(agg.tokens_per_event),
        "recent": len(agg.recent),
        "warnings": len(agg.warnings),
        "engine_history": len(agg.engine_history),
        "debt": len(agg._owed),
    }
    out.update({name: len(getattr(agg, name)) for name in PER_REQUEST})
    gc.collect()
    out["traced"] = tracemalloc.get_traced_memory()[0]
    return out


def test_a_week_of_churning_users_models_and_requests_stays_bounded() -> None:
    clock = Clock()
    active: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), active, clock=clock)
    col = LlmtopCollector(agg)
    at: dict[int, dict[str, Any]] = {}
    seen = bytearray(USERS)  # before tracing starts
    k = 0
    tracemalloc.start()
    try:
        for i in range(WEEK):
            t = clock.advance(STEP_S)
            first = i * USERS // WEEK
            model = f"model-{i * MODELS // WEEK}"
            recs = []
            for j in range(PER_STEP):
                lat = LATENCIES[(k + j) % len(LATENCIES)]
                u = first + ((k + j) * 7919) % USER_WINDOW
                seen[min(u, USERS - 1)] = 1
                recs.append(record(
                    user=f"user-{u}",
                    model=model if j % 2 else "main", ttft=lat * 10,
                    gaps=(lat, lat * 2, lat / 2) * 3, rid=f"r{k + j}", t_start=t - 2))
            k += PER_STEP
            # requests seen open by the ticks whose records never come (a worker killed
            # mid-stream, a client gone): new ids at every tick, one with slices filed
            active.clear()
            ns = int(i * STEP_S * 1e9)
            for n in range(3):
                rid = f"open-{i}-{n}"
                active[rid] = _open(rid, f"user-{first}", model, t, ns)
            lost = ChunkSlice(id=f"open-{i}-0", user=f"user-{first}", model=model, t=t,
                              t0_ns=ns, first=0, prev_ns=None,
                              offsets_ns=tuple(ns + 10**8 + m * 10**6 for m in range(12)),
                              tokens=(1,) * 12)
            agg.tick()
            agg.on_events([lost, *recs])
            clock.advance(1.0)
            agg.tick()
            if (i + 1) % STEPS_PER_DAY == 0 and (i + 1) // STEPS_PER_DAY in (1, 7):
                at[(i + 1) // STEPS_PER_DAY] = _measure(agg, col)
    finally:
        tracemalloc.stop()
    day1, day7 = at[1], at[7]
    print("day 1:", day1)
    print("day 7:", day7, "users seen:", sum(seen))
    assert sum(seen) > 80_000
    for key, v1 in day1.items():
        assert day7[key] <= 2 * v1 + 16, (key, v1, day7[key])
    # the per-request dicts hold the requests open now and those seen within the forget
    # delay, not a week's worth
    forget_ticks = 2 * (_LIVE_FORGET_S / STEP_S + 2)
    for name in PER_REQUEST:
        assert day7[name] <= 3 * forget_ticks, (name, day7[name])
    cfg = Config()
    assert day7["users.scores"] <= 9 * cfg.top_users


def test_hundreds_of_thousands_of_short_requests_seen_only_open_are_forgotten() -> None:
    """Live rows that change ids at every tick, as ``--workers`` reports them
    (:class:`FleetActive`), 200,000 of them: two in five end with a record, the others
    never do (their worker killed mid-stream, its rows gone with it). The per-request
    dicts hold what the forget delay allows, not every id the ticks ever saw."""
    clock = Clock()
    fleet = FleetActive()
    agg = Aggregator(Config(), fleet, clock=clock)
    most = dict.fromkeys(PER_REQUEST, 0)
    ticks = 40_000
    for i in range(ticks):
        t = clock.advance(1.0)
        ns = i * 10**9
        rows = [_open(f"s-{i}-{n}", f"u-{i % 5_000}", f"m-{i % 40}", t, ns) for n in range(5)]
        fleet.update(i % 2, rows, sender=f"proc-{i}")  # a new process each time
        agg.tick()
        fleet.drop(i % 2)  # gone, before the records of two of them come
        agg.on_events([record(user=f"u-{i % 5_000}", model=f"m-{i % 40}", rid=f"s-{i}-{n}",
                              t_start=t) for n in range(2)])
        if i % 997 == 0:
            for name in PER_REQUEST:
                most[name] = max(most[name], len(getattr(agg, name)))
    bound = 3 * (_LIVE_FORGET_S + 10)  # three ids a second never end
    assert all(n <= bound for n in most.values()), most
    assert most["_live"] >= 3 * _LIVE_FORGET_S * 0.9  # they were kept while they could come
