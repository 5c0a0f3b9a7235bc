"""A model named "unknown" is not the requests that named no model; a blank name names none.

Requests naming no model are counted as the model "unknown" (snapshot ``models[].model``,
/metrics ``model="unknown"``). A model literally named "unknown" was counted in that same
row, and a whitespace-only name (" ") made a row of its own that reads as empty in the
TUI's model table. Now a blank name (empty or whitespace only) names no model: "unknown";
a model literally named ``unknown`` gets the label ``unknown_`` (and ``unknown_``
``unknown__``, one ``_`` more each, as a model named ``other`` is told apart from the fold in
/metrics), the same in the snapshot, /metrics and everything read from the snapshot.
Live tokens and learned tokens-per-event rates follow the same names.
"""

from __future__ import annotations

from metrics_records import Clock, open_stream, record
from test_metrics_prometheus import scrape, value

from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.labels import UNNAMED_MODEL, model_label

MODELS: list[str | None] = [None, "", " ", "\t\n", "unknown", "unknown", "unknown_", "m"]


def _agg() -> Aggregator:
    clock = Clock()
    agg = Aggregator(Config(), clock=clock)
    clock.advance(1)
    agg.on_events([record(model=m) for m in MODELS])
    agg.tick()
    return agg


def test_model_label() -> None:
    assert UNNAMED_MODEL == "unknown"
    assert [model_label(m) for m in MODELS] == [
        "unknown", "unknown", "unknown", "unknown", "unknown_", "unknown_", "unknown__", "m"]
    assert model_label(" m ") == " m "  # a name is kept as sent: the engine tells them apart
    assert model_label("unknown model") == "unknown model"


def test_snapshot_rows_tell_the_model_unknown_from_no_model() -> None:
    snap = _agg().snapshot(None)
    rows = {r["model"]: r["requests"] for r in snap["models"]}
    assert rows == {"unknown": 4, "unknown_": 2, "unknown__": 1, "m": 1}, rows


def test_metrics_labels_agree_with_the_snapshot() -> None:
    agg = _agg()
    s = scrape(agg)
    labels = {x.labels["model"] for x in s["llmtop_model_requests_total"]}
    assert labels == {r["model"] for r in agg.snapshot(None)["models"]}
    assert value(s, "llmtop_model_requests_total", model="unknown", outcome="ok") == 4
    assert value(s, "llmtop_model_requests_total", model="unknown_", outcome="ok") == 2


def test_a_blank_models_live_tokens_and_rate_are_the_unnamed_ones() -> None:
    clock = Clock()
    reg: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), reg, clock=clock)
    agg.tokens_per_event["unknown"] = 2.0  # learned from answers that named no model
    a = open_stream(reg, "A", "alice", clock.t, model=" ")
    for _ in range(4):
        clock.advance(0.5)
        a.tokens += 10
        a.chunks += 10
        agg.tick()
    snap = agg.snapshot(None)
    assert {r["model"]: r["output_tokens"] for r in snap["models"]} == {"unknown": 80}
