"""GPU_MEMORY beside an engine that reserves its KV cache at start-up (vLLM's
``--gpu-memory-utilization``, SGLang's ``--mem-fraction-static``): NVML reads 90-97 % used
on an idle server, so with a fresh KV-cache reading from the engine GPU_MEMORY needs the KV
cache near full too; without one, memory alone decides, as before, and the message says
which case it is. The real monitor on a virtual clock; the GPU is injected readings, as
NVML's source publishes them."""

from __future__ import annotations

from itertools import pairwise

from llmtop.config import Config, load_config
from llmtop.events import EngineReading, Event, GpuReading, WarningEvent
from llmtop.saturation import SaturationMonitor

T0 = 1_800_000_000.0
GIB = 1024**3
H200 = 143_771 * 1024**2
"""NVML's total for an H200."""


class Harness:
    def __init__(self, **overrides: object) -> None:
        self.events: list[Event] = []
        self.cfg: Config = load_config(None, env={}, overrides=dict(overrides))
        self.mon = SaturationMonitor(self.cfg, self.events.append, {})
        self.now = T0

    def gpu(self, used: float) -> None:
        """GPU 0 with ``used`` (a fraction) of an H200's memory in use."""
        self.mon.on_events([GpuReading(t=self.now, index=0, name="NVIDIA H200",
                                       mem_used_bytes=round(used * H200),
                                       mem_total_bytes=H200)])

    def engine(self, kv: float | None, kind: str = "vllm") -> None:
        self.mon.on_events([EngineReading(t=self.now, kind=kind, running=0, waiting=0,
                                          kv_cache_usage=kv, preemptions=0)])

    def run(self, seconds: int, used: float | None = None, kv: float | None = None,
            kind: str | None = "vllm") -> None:
        """``seconds`` one-second ticks, a GPU reading (``used``) and an engine reading
        (``kv``, from ``kind``; ``kind=None``: no engine reading) before each."""
        for _ in range(seconds):
            self.now += 1.0
            if used is not None:
                self.gpu(used)
            if kind is not None:
                self.engine(kv, kind)
            self.mon.tick(self.now, int(self.now * 1e9))

    def warnings(self, code: str, state: str = "raised") -> list[WarningEvent]:
        return [e for e in self.events if isinstance(e, WarningEvent) and e.code == code
                and e.state == state]

    def codes(self) -> set[str]:
        return {e.code for e in self.events if isinstance(e, WarningEvent)}


def test_idle_vllm_at_96_percent_memory_with_an_empty_kv_cache_raises_nothing() -> None:
    """--gpu-memory-utilization 0.96 on an idle server: NVML 96 %, KV cache 2 %."""
    h = Harness()
    h.run(120, used=0.96, kv=0.02)
    assert h.codes() == set()
    assert not h.mon.states["GPU_MEMORY"].held


def test_sglang_and_the_simulator_count_as_engines_with_a_kv_reading() -> None:
    for kind in ("sglang", "sim", "llamacpp"):
        h = Harness()
        h.run(60, used=0.97, kv=0.10, kind=kind)
        assert h.codes() == set(), kind


def test_memory_and_kv_cache_both_full_raise_gpu_memory_and_kv_cache() -> None:
    h = Harness()
    h.run(5, used=0.96, kv=0.97)
    assert h.codes() == {"GPU_MEMORY", "KV_CACHE"}
    (ev,) = h.warnings("GPU_MEMORY")
    assert ev.severity == "warning"
    assert "memory 96% used" in ev.message and "KV cache 97% full" in ev.message
    assert "gpu_memory_utilization will not fit" in ev.message
    assert "memory alone" not in ev.message


def test_kv_cache_full_on_a_gpu_with_room_is_kv_cache_alone() -> None:
    """A full pool on a GPU with memory to spare (gpu_memory_utilization 0.8): the pool
    could grow — KV_CACHE, not GPU_MEMORY."""
    h = Harness()
    h.run(30, used=0.80, kv=0.99)
    assert h.codes() == {"KV_CACHE"}


def test_no_engine_reading_at_96_percent_raises_gpu_memory_on_memory_alone() -> None:
    """No engine metrics (Ollama, or none scraped): memory decides, as before."""
    h = Harness()
    h.run(5, used=0.96, kind=None)
    (ev,) = h.warnings("GPU_MEMORY")
    assert h.codes() == {"GPU_MEMORY"}
    assert "memory 96% used" in ev.message and "no room for more KV cache" in ev.message
    assert "memory alone: no engine metrics" in ev.message
    assert "vLLM" in ev.message  # says that a preallocating engine reads this full idle


def test_an_engine_without_a_kv_gauge_leaves_memory_to_decide_and_says_so() -> None:
    h = Harness()
    h.run(5, used=0.96, kv=None, kind="tgi")
    (ev,) = h.warnings("GPU_MEMORY")
    assert "the engine (tgi) exports no KV-cache usage" in ev.message
    h = Harness()
    h.run(5, used=0.96, kv=None, kind="unknown")
    (ev,) = h.warnings("GPU_MEMORY")
    assert "name no engine llmtop knows" in ev.message


def test_a_stale_kv_reading_is_no_reading_and_the_message_does_not_tick() -> None:
    """The engine's /metrics stop answering: after a window its last KV figure is not
    used (KV_CACHE drops it at the same age); memory alone decides, with a message that
    stays the same while it lasts (an age in it would republish the warning every 5 s)."""
    h = Harness()
    h.run(20, used=0.96, kv=0.02)
    assert h.codes() == set()
    h.run(9, used=0.96, kind=None)  # the last reading is 9 s old: still fresh (W = 10 s)
    assert h.codes() == set()
    h.run(40, used=0.96, kind=None)
    raised = h.warnings("GPU_MEMORY")
    assert len(raised) == 1 and h.codes() == {"GPU_MEMORY"}
    assert "KV-cache reading is stale (over 10 s old)" in raised[0].message


def test_engine_reading_late_at_start_up_raises_nothing() -> None:
    """llmtop starts: NVML answers first, the engine's first scrape a second later — the
    raise delay covers it, memory alone never raises."""
    h = Harness()
    h.run(1, used=0.96, kind=None)
    h.run(60, used=0.96, kv=0.0)
    assert h.codes() == set()


def test_hysteresis_raise_delay_held_thresholds_and_clear_delay() -> None:
    h = Harness()
    h.run(30, used=0.96, kv=0.02)
    # both full: raised only after raise_after_s (2 s) of it
    h.run(1, used=0.96, kv=0.97)
    assert h.warnings("GPU_MEMORY") == []
    h.run(2, used=0.96, kv=0.97)
    assert len(h.warnings("GPU_MEMORY")) == 1
    # held: down to 93 % memory and 90 % KV it stays, nothing clears
    h.run(30, used=0.935, kv=0.91)
    assert h.warnings("GPU_MEMORY", "cleared") == []
    # the KV cache drains (memory stays reserved): cleared after clear_after_s (15 s)
    h.run(14, used=0.96, kv=0.30)
    assert h.warnings("GPU_MEMORY", "cleared") == []
    h.run(2, used=0.96, kv=0.30)
    (cleared,) = h.warnings("GPU_MEMORY", "cleared")
    assert "KV cache" in cleared.message
    assert h.warnings("KV_CACHE", "cleared")  # the pool is no longer full either


def test_kv_cache_hovering_at_the_threshold_does_not_flap() -> None:
    h = Harness()
    for i in range(60):
        h.run(1, used=0.96, kv=0.96 if i % 2 else 0.94)
    raised = h.warnings("GPU_MEMORY")
    assert raised and h.warnings("GPU_MEMORY", "cleared") == []
    # one raise; the later events are its updates (new figures, at most every 5 s)
    assert h.mon.states["GPU_MEMORY"].raised_at == raised[0].t
    assert all(b.t - a.t >= 5 for a, b in pairwise(raised))


def test_kv_cache_full_only_briefly_raises_nothing() -> None:
    """A KV reading at the threshold for less than the raise delay, between idle ones."""
    h = Harness()
    for _ in range(10):
        h.run(1, used=0.96, kv=0.97)
        h.run(3, used=0.96, kv=0.05)
    assert h.warnings("GPU_MEMORY") == []


def test_raised_on_memory_alone_clears_once_the_engine_shows_room() -> None:
    """No engine metrics at first (GPU_MEMORY on memory alone); the engine's scrape starts
    answering with an empty KV cache: the reservation is explained, and the warning clears
    after the clear delay."""
    h = Harness()
    h.run(5, used=0.96, kind=None)
    assert len(h.warnings("GPU_MEMORY")) == 1
    h.run(14, used=0.96, kv=0.02)
    assert h.warnings("GPU_MEMORY", "cleared") == []
    h.run(2, used=0.96, kv=0.02)
    assert len(h.warnings("GPU_MEMORY", "cleared")) == 1


def test_thresholds_follow_the_config() -> None:
    h = Harness(**{"warnings.gpu_memory": 0.9, "warnings.kv_cache_usage": 0.8})
    h.run(10, used=0.92, kv=0.5)
    assert h.codes() == set()
    h.run(5, used=0.92, kv=0.85)
    assert h.codes() == {"GPU_MEMORY", "KV_CACHE"}
