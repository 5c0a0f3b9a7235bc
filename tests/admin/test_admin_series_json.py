"""The snapshot route encodes a snapshot's ``series`` once per change of its points: the
body is the same bytes as the whole snapshot encoded at once, before and after new points,
and through the plain-``json`` fallback for what orjson refuses."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import orjson

from llmtop.admin.routes import _ORJSON_OPTIONS, AdminContext, snapshot_json
from llmtop.config import Config
from llmtop.metrics.aggregator import Aggregator


def _snap(points: deque[dict[str, Any]], extra: Any = 1) -> dict[str, Any]:
    return {"version": 1, "system": {"rps": 0.5, "nan": float("nan")},
            "series": list(points), "slo": {"target": 0.95}, "extra": extra}


def test_series_json_is_reused_while_its_points_stay() -> None:
    ctx = AdminContext(aggregator=Aggregator(Config()), active={})
    points: deque[dict[str, Any]] = deque(maxlen=3)
    for i in range(6):
        points.append({"t": float(i), "rps": i / 3, "ttft_p95": None if i % 2 else 0.25})
        for _ in range(2):  # the second build finds the first's series JSON
            snap = _snap(points)
            want = orjson.dumps(_snap(points), option=_ORJSON_OPTIONS)
            assert snapshot_json(ctx, snap) == want
            assert ctx.series_json is not None and ctx.series_json[0] == list(points)
    reused = ctx.series_json
    assert snapshot_json(ctx, _snap(points)) and ctx.series_json is reused
    # a point that equals the last one but is a new object: encoded anew
    points.append(dict(points[-1]))
    assert snapshot_json(ctx, _snap(points)) == orjson.dumps(_snap(points),
                                                             option=_ORJSON_OPTIONS)
    assert ctx.series_json is not reused


def test_snapshot_json_falls_back_to_json_for_huge_ints() -> None:
    ctx = AdminContext(aggregator=Aggregator(Config()), active={})
    points = deque([{"t": 1.0, "rps": float("inf")}])
    snapshot_json(ctx, _snap(points))  # remembered, then a build orjson refuses
    body = snapshot_json(ctx, _snap(points, extra=1 << 70))
    assert json.loads(body) == {"version": 1, "system": {"rps": 0.5, "nan": None},
                                "series": [{"t": 1.0, "rps": None}],
                                "slo": {"target": 0.95}, "extra": 1 << 70}
    assert snapshot_json(ctx, _snap(deque())) == orjson.dumps(_snap(deque()),
                                                              option=_ORJSON_OPTIONS)
