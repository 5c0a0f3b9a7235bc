"""benchmarks/proxy_overhead.py's verdict at one stream says when its TTFT percentiles come
from too few requests to be more than single requests' figures (paced, 5 s: ~8)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from proxy_overhead import FEW_REQUESTS, Result, verdict


def _rows(requests: int) -> dict[int, dict[str, Result]]:
    def row(name: str, ttft: float) -> Result:
        return Result(name, 1, ttft_over=[ttft] * requests, chunk_delay=[1e-4] * requests)
    return {1: {"direct": row("direct", 1e-3), "llmtop": row("llmtop", 1.3e-3),
                "nginx": row("nginx", 1.2e-3)}}


@pytest.mark.parametrize("requests", [1, 8, FEW_REQUESTS - 1])
def test_few_requests_are_said(requests: int) -> None:
    lines = [x for x in verdict("paced", _rows(requests)) if "TTFT" in x]
    assert len(lines) == 2
    assert all(f"({requests} requests: each percentile is one request's figure" in x
               for x in lines)
    assert lines[0].startswith("[paced] PASS 1 stream: added TTFT p50 <= 0.5 ms: 0.30 ms")


def test_enough_requests_say_nothing_more() -> None:
    lines = [x for x in verdict("paced", _rows(FEW_REQUESTS)) if "TTFT" in x]
    assert lines == ["[paced] PASS 1 stream: added TTFT p50 <= 0.5 ms: 0.30 ms",
                     "[paced] PASS 1 stream: added TTFT p99 <= nginx p99 + 0.5 ms: "
                     "0.30 vs nginx 0.20 ms"]
