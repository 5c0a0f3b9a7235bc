"""A request's take-back is one: its user, its model and the system give back together.

Live tokens are attributed at the model's learned tokens per event; a request that ends
with fewer tokens than were attributed takes the difference back, and what the current
interval cannot give back is owed and taken from later tokens (``Aggregator._settle_out``).
Users and the system owed together (47c4c29), but model rows owed on their own: with one
model, Alice's answer ending 1,500 tokens over-attributed made the model's row read 0 tok/s
for about 10 s while the system (the users' sum) read Bob's 135. Now the take-back is
settled per request, as far as both its user's and its model's current tokens allow, so
the system's row is the sum of the users' rows and the sum of the models' rows at every
read, in every window, and the all-time counts are the engines' at once.
"""

from __future__ import annotations

import random

from metrics_records import Clock, open_stream, record
from takeback_support import alice_ends_over_attributed

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator

WINDOWS = (10, 60, 300, None)


def sums(snap: dict[str, object]) -> tuple[int, int, int]:
    """(system, users' sum, models' sum) of a snapshot's output tokens."""
    system, users, models = snap["system"], snap["users"], snap["models"]
    assert isinstance(system, dict) and isinstance(users, list) and isinstance(models, list)
    return (int(system["output_tokens"]), sum(int(u["output_tokens"]) for u in users),
            sum(int(m["output_tokens"]) for m in models))


def test_one_models_row_reads_what_the_system_reads_after_a_take_back() -> None:
    clock, agg, bob = alice_ends_over_attributed()
    for i in range(40):  # 20 s of Bob alone
        clock.advance(0.25)
        for w in WINDOWS:  # between ticks too: the live tail takes back as a tick would
            s, u, m = sums(agg.snapshot(w))
            assert s == u == m, (i, w, s, u, m)
        clock.advance(0.25)
        bob.tokens += 50
        bob.chunks += 50
        agg.tick()
        for w in WINDOWS:
            s, u, m = sums(agg.snapshot(w))
            assert s == u == m, (i, w, s, u, m)
        snap = agg.snapshot(10)
        model_row = next(r for r in snap["models"] if r["model"] == "m")
        assert model_row["output_tps"] == snap["system"]["output_tps"], i
        if i >= 19:  # the 10 s window holds Bob alone: 135 tok/s (Alice taught 1.35)
            assert model_row["output_tps"] > 100, (i, model_row["output_tps"])
    total = agg.snapshot(None)
    users = {u["user"]: u["output_tokens"] for u in total["users"]}
    assert users["alice"] == 3000  # the session's count is the engine's at once
    assert total["models"][0]["output_tokens"] == total["system"]["output_tokens"]


def test_a_random_mix_of_users_and_models_adds_up_at_every_read() -> None:
    """60 users (beyond top_users: some fold into "other" and are promoted and demoted),
    5 models at different learned rates, usage off by up to +-3 tokens an event... and the
    all-time counts exact: the engines' usage summed."""
    rnd = random.Random(7)
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    cfg = Config()
    agg = Aggregator(cfg, reg, clock=clock)
    models = [f"m{k}" for k in range(5)]
    for k, m in enumerate(models):
        agg.tokens_per_event[m] = 1.0 + 0.4 * k
    users = [f"u{k}" for k in range(60)]
    assert cfg.top_users < len(users)
    n = 0
    usage_total = 0
    usage_by_model = dict.fromkeys(models, 0)
    bad: list[tuple[int, object, int, int, int]] = []
    for step in range(400):  # 200 s
        if len(reg) < 30 and rnd.random() < 0.6:
            n += 1
            open_stream(reg, f"r{n}", rnd.choice(users[: 10 + step // 4]), clock.t,
                        model=rnd.choice(models))
        for a in reg.values():
            k = rnd.randint(0, 20)
            a.tokens += k
            a.chunks += k
        for rid in [r for r in reg if rnd.random() < 0.05]:
            a = reg.pop(rid)
            usage = max(0, a.tokens + rnd.randint(-3, 3) * max(1, a.tokens // 10))
            usage_total += usage
            usage_by_model[a.model or "unknown"] += usage
            agg.on_events([record(rid=rid, user=a.user, model=a.model, t_start=a.t_start,
                                  gaps=[0.001] * max(a.tokens - 1, 0),
                                  completion_tokens=usage)])
        clock.advance(0.5 if step % 3 else 0.2)
        if step % 3 != 1:
            agg.tick()
        for w in WINDOWS:
            snap = agg.snapshot(w)
            s, u, m = sums(snap)
            if not s == u == m:
                bad.append((step, w, s, u, m))
            for row in [*snap["users"], *snap["models"]]:  # promotions mid-stream too
                if row["output_tokens"] < 0:
                    bad.append((step, w, row.get("user", row.get("model")),
                                row["output_tokens"], 0))
    assert not bad, bad[:10]
    assert agg.users.demotions > 0  # the fold into "other" took what its users owed
    for rid in list(reg):  # the rest end with the events counted, and no more tokens
        a = reg.pop(rid)
        usage_total += a.tokens
        usage_by_model[a.model or "unknown"] += a.tokens
        agg.on_events([record(rid=rid, user=a.user, model=a.model, t_start=a.t_start,
                              gaps=[0.001] * max(a.tokens - 1, 0),
                              completion_tokens=a.tokens)])
    total = agg.snapshot(None)
    assert total["system"]["output_tokens"] == usage_total
    by_model = {r["model"]: r["output_tokens"] for r in total["models"]}
    assert by_model == usage_by_model
    assert sum(r["output_tokens"] for r in total["users"]) == usage_total
