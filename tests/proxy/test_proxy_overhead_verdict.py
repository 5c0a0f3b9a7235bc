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


def _round(llmtop_chunk_s: float, llmtop_cpu: float = 30.0) -> dict[str, Result]:
    """One round at 64 streams: direct adds nothing, nginx 1 ms to each chunk."""
    def row(name: str, chunk: float, cpu: float | None) -> Result:
        return Result(name, 64, ttft_over=[1e-3 + chunk] * 100, chunk_delay=[chunk] * 100,
                      cpu_us_per_chunk=cpu, rss_kib_per_stream=20.0)
    return {"direct": row("direct", 0.0, None), "nginx": row("nginx", 1e-3, 20.0),
            "llmtop": row("llmtop", llmtop_chunk_s, llmtop_cpu)}


def test_each_target_says_in_how_many_rounds_it_held() -> None:
    # two rounds at 1.2x nginx, one at 3x: the pooled p99 is the bad round's figure
    rounds = [_round(1.2e-3), _round(3e-3, llmtop_cpu=50.0), _round(1.2e-3)]
    pooled = {name: Result(name, 64,
                           ttft_over=[v for r in rounds for v in r[name].ttft_over],
                           chunk_delay=[v for r in rounds for v in r[name].chunk_delay],
                           cpu_us_per_chunk=rounds[0][name].cpu_us_per_chunk,
                           rss_kib_per_stream=20.0)
              for name in rounds[0]}
    lines = verdict("paced", {64: pooled}, {64: rounds})
    chunk = next(x for x in lines if "chunk delay p99" in x)
    assert chunk.startswith("[paced] MISS 64 streams: added chunk delay p99 <= 1.5x nginx")
    assert chunk.endswith("(held in 2 of 3 rounds)")
    cpu = next(x for x in lines if "CPU per chunk" in x)
    assert cpu.startswith("[paced] PASS") and cpu.endswith("(held in 2 of 3 rounds)")
    assert next(x for x in lines if "coalescing" in x).endswith("(held in 3 of 3 rounds)")
    # RSS is the untimed first phase's figure: a timed round's own is not judged
    assert next(x for x in lines if "RSS" in x) == (
        "[paced] PASS 64 streams: RSS per open stream <= 64 KiB: 20.0 KiB")


def test_one_round_says_nothing_of_rounds() -> None:
    one = _round(1.2e-3)
    lines = verdict("paced", {64: one}, {64: [one]})
    assert lines and not any("rounds)" in x for x in lines)
    assert verdict("paced", {64: one}) == lines
