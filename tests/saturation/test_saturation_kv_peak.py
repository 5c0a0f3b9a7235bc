"""KV_CACHE raised on preemptions said "KV cache 0% full; 2 preemptions in 10 s" (the
report helper's QA, a real sim run): preemptions free the pool they happened in, so by the
time they are counted the engine can read empty, and the message gave no hint that the
pool had been full. The window's peak is now said beside the current usage."""

from __future__ import annotations

from test_saturation_unit import Harness

from llmtop.events import EngineReading


def test_preemptions_after_the_pool_emptied_say_its_peak() -> None:
    h = Harness()
    h.feed(EngineReading(t=h.now, kind="vllm", running=4, waiting=0, kv_cache_usage=0.3,
                         preemptions=0))
    h.step()
    h.feed(EngineReading(t=h.now, kind="vllm", running=4, waiting=2, kv_cache_usage=1.0,
                         preemptions=0))
    h.step()
    for _ in range(3):  # the preemptions are counted once the pool has emptied
        h.feed(EngineReading(t=h.now, kind="vllm", running=0, waiting=4, kv_cache_usage=0.0,
                             preemptions=2))
        h.step()
    assert "KV_CACHE" in h.codes()
    msg = h.mon.raised()["KV_CACHE"]
    assert "KV cache 0% full (100% at most in" in msg, msg
    assert "2 preemptions" in msg


def test_a_pool_full_now_says_no_peak() -> None:
    h = Harness()
    for k in range(4):
        h.feed(EngineReading(t=h.now, kind="vllm", running=4, waiting=2, kv_cache_usage=0.99,
                             preemptions=k))
        h.step()
    msg = h.mon.raised()["KV_CACHE"]
    assert "KV cache 99% full;" in msg and "at most" not in msg, msg
