"""TTFT p95 (the saturation detectors' view) follows first tokens as they come.

QA: 12 streams with a 2 s TTFT and then 40 s of tokens showed no TTFT until they ended.
``Signals.sample`` now notes a stream's TTFT when it first sees its first token; its
record adds no second sample; a request that starts and ends between two samples is taken
from its record."""

from __future__ import annotations

from llmtop.config import SloConfig
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.saturation.signals import Signals

T0 = 1_796_000_000.0
NS = 1_000_000_000


def rec(rid: str, t_start: float, ttft: float, e2e: float) -> RequestRecord:
    return RequestRecord(
        id=rid, user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=t_start, ttft_s=ttft, e2e_s=e2e,
        prompt_tokens=10, completion_tokens=2, token_source="usage",
        chunk_offsets_s=(ttft, e2e), chunk_tokens=(1, 1))


def test_a_long_streams_ttft_counts_from_its_first_token_once() -> None:
    sig = Signals(SloConfig(ttft_s=1.0))
    active: dict[str, ActiveRequest] = {}
    for i in range(12):
        active[f"s{i}"] = ActiveRequest(f"s{i}", "u", "m", "openai", "/v1/chat/completions",
                                        True, T0, t0_ns=0)
    sig.sample(T0 + 1.0, active, 1 * NS)
    assert sig.ttft_p95(T0 + 1.0, 10.0) is None
    for a in active.values():
        a.first_token_ns = 2 * NS
        a.tokens = a.chunks = 1
    sig.sample(T0 + 2.5, active, 2_500_000_000)
    p95 = sig.ttft_p95(T0 + 2.5, 10.0)
    assert p95 is not None and abs(p95 - 2.0) < 1e-6
    for k in range(3, 43):
        sig.sample(T0 + k, active, k * NS)
    assert sig.ttft_p95(T0 + 42, 10.0) is None  # the first tokens came 40 s ago
    ids = list(active)
    active.clear()
    sig.on_events([rec(i, T0, 2.0, 42.5) for i in ids])
    sig.sample(T0 + 43, active, 43 * NS)
    assert sig.ttft_p95(T0 + 43, 10.0) is None  # the records add no second sample
    assert not sig._ttft_noted


def test_a_request_between_two_samples_is_taken_from_its_record() -> None:
    sig = Signals(SloConfig())
    sig.sample(T0, {}, 0)
    sig.on_events([rec("short", T0 + 0.1, 0.3, 0.5)])
    sig.sample(T0 + 1.0, {}, NS)
    p95 = sig.ttft_p95(T0 + 1.0, 10.0)
    assert p95 is not None and abs(p95 - 0.3) < 1e-9
    non_streamed = ActiveRequest("ns", "u", "m", "openai", "/v1/chat/completions", False, T0,
                                 t0_ns=0, first_token_ns=NS // 2)
    sig2 = Signals(SloConfig())
    sig2.sample(T0 + 1.0, {"ns": non_streamed}, NS)
    assert sig2.ttft_p95(T0 + 1.0, 10.0) is None  # a non-streamed answer has no TTFT
