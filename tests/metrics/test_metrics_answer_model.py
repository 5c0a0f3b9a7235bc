"""A stream whose answer names another model than its request is counted in one model row.

The proxy's registry holds the model the request asked for ("gpt-4o"); the record holds the
one the answer named ("gpt-4o-2024-08-06", as OpenAI answers). Live tokens went to the
asked-for row and the record's correction to the answered one: a request streaming 500
events whose usage said 450 left the all-time rows at gpt-4o 500 tokens (no request) and
gpt-4o-2024-08-06 -50 tokens (an llmtop_model_output_tokens_total that went below zero).
Now the all-time rows are the engines' counts by the answer's model, and the windows keep the
live tokens where they were counted and take the correction back from there, so no row goes
below zero and every window's models add up to the system. The asked-for name also learns
the stream's tokens per event: the next stream of it is attributed at the engine's rate.
"""

from __future__ import annotations

import random

from metrics_records import Clock, open_stream, record
from test_metrics_prometheus import scrape, value

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator

ASKED, ANSWERED = "gpt-4o", "gpt-4o-2024-08-06"


def _stream(agg: Aggregator, reg: dict[str, ActiveRequest], clock: Clock, rid: str,
            usage: int) -> None:
    a = open_stream(reg, rid, "alice", clock.t, model=ASKED)
    for _ in range(10):
        clock.advance(0.5)
        a.tokens += 50
        a.chunks += 50
        agg.tick()
    del reg[rid]
    agg.on_events([record(rid=rid, user="alice", model=ANSWERED, t_start=a.t_start,
                          gaps=[0.01] * (a.tokens - 1), completion_tokens=usage)])


def _rows(snap: dict[str, object]) -> dict[str, tuple[int, int]]:
    models = snap["models"]
    assert isinstance(models, list)
    return {r["model"]: (r["requests"], r["output_tokens"]) for r in models}


def test_the_answers_model_row_holds_the_engines_count() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    _stream(agg, reg, clock, "A", 450)
    for _ in range(30):
        clock.advance(0.5)
        agg.tick()
        for w in (10, 60, 300, None):
            snap = agg.snapshot(w)
            rows = _rows(snap)
            assert all(t >= 0 for _, t in rows.values()), (w, rows)
            assert sum(t for _, t in rows.values()) == snap["system"]["output_tokens"], w
    assert _rows(agg.snapshot(None)) == {ANSWERED: (1, 450)}
    s = scrape(agg)
    assert value(s, "llmtop_model_output_tokens_total", model=ANSWERED) == 450
    # the asked-for name learned 0.9 tokens an event: the next stream is attributed so
    assert agg.tokens_per_event.get(ASKED) == 0.9


def test_a_random_mix_of_asked_and_answered_names_adds_up() -> None:
    """Half the streams are answered under a dated name, at rates off the learned ones:
    every read's model rows add up to the system and none is below zero; the all-time rows
    are the engines' counts by the answer's model."""
    rnd = random.Random(3)
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    asked = ["a", "b", "c"]
    by_answer: dict[str, int] = {}
    n = 0
    for step in range(300):
        if len(reg) < 12 and rnd.random() < 0.5:
            n += 1
            open_stream(reg, f"r{n}", f"u{n % 7}", clock.t, model=rnd.choice(asked))
        for a in reg.values():
            k = rnd.randint(0, 30)
            a.tokens += k
            a.chunks += k
        for rid in [r for r in reg if rnd.random() < 0.06]:
            a = reg.pop(rid)
            answer = (a.model or "") + ("-2024" if rnd.random() < 0.5 else "")
            usage = max(0, round(a.tokens * rnd.choice((0.5, 0.9, 1.0, 1.7))))
            by_answer[answer] = by_answer.get(answer, 0) + usage
            agg.on_events([record(rid=rid, user=a.user, model=answer, t_start=a.t_start,
                                  gaps=[0.001] * max(a.tokens - 1, 0),
                                  completion_tokens=usage)])
        clock.advance(0.5)
        agg.tick()
        for w in (10, 60, None):
            snap = agg.snapshot(w)
            rows = _rows(snap)
            assert all(t >= 0 for _, t in rows.values()), (step, w, rows)
            assert sum(t for _, t in rows.values()) == snap["system"]["output_tokens"], \
                (step, w)
    for rid in list(reg):
        a = reg.pop(rid)
        by_answer[a.model or ""] = by_answer.get(a.model or "", 0) + a.tokens
        agg.on_events([record(rid=rid, user=a.user, model=a.model, t_start=a.t_start,
                              gaps=[0.001] * max(a.tokens - 1, 0), completion_tokens=a.tokens)])
    rows = _rows(agg.snapshot(None))
    assert {m: t for m, (_, t) in rows.items() if t} == {m: t for m, t in by_answer.items() if t}
