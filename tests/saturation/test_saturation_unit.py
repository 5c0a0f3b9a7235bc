"""Detectors on synthetic evidence with a virtual clock: each fires on its evidence, stays
quiet without it, and clears only after the hysteresis period."""

from __future__ import annotations

from llmtop.config import Config, load_config
from llmtop.events import (
    ActiveRequest,
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    WarningEvent,
)
from llmtop.saturation import SaturationMonitor

T0 = 1_800_000_000.0


def cfg() -> Config:
    return load_config(None, env={})


def record(t_start: float, *, ttft: float = 0.1, n: int = 20, gap: float = 0.02,
           outcome: str = "ok", status: int = 200, prompt: int = 50,
           gaps: list[float] | None = None) -> RequestRecord:
    gs = gaps if gaps is not None else [gap] * (n - 1)
    offs = [ttft]
    for g in gs:
        offs.append(offs[-1] + g)
    return RequestRecord(
        id=f"r{t_start}", user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=status, outcome=outcome,  # type: ignore[arg-type]
        t_start=t_start, ttft_s=ttft if outcome == "ok" else None, e2e_s=offs[-1],
        prompt_tokens=prompt, completion_tokens=len(offs), token_source="usage",
        chunk_offsets_s=tuple(offs), chunk_tokens=tuple([1] * len(offs)),
    )


class Harness:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.active: dict[str, ActiveRequest] = {}
        self.down = False
        self.mon = SaturationMonitor(cfg(), self.events.append, self.active,
                                     upstream_down=lambda: self.down)
        self.now = T0

    def feed(self, *evs: Event) -> None:
        self.mon.on_events(list(evs))

    def step(self, seconds: float = 1.0) -> list[WarningEvent]:
        self.now += seconds
        ns = int(self.now * 1e9)
        return self.mon.tick(self.now, ns)

    def set_waiting(self, n: int, age_s: float = 0.0) -> None:
        self.active.clear()
        for i in range(n):
            self.active[f"w{i}"] = ActiveRequest(
                id=f"w{i}", user="u", model="m", dialect="openai", path="/", stream=True,
                t_start=self.now - age_s, t0_ns=int((self.now - age_s) * 1e9))

    def codes(self, state: str = "raised") -> list[str]:
        return [e.code for e in self.events if isinstance(e, WarningEvent) and e.state == state]


def healthy_traffic(h: Harness, seconds: int) -> None:
    for _ in range(seconds):
        h.feed(*[record(h.now - 1.0 + i * 0.1) for i in range(5)])
        h.step()


def test_healthy_steady_traffic_raises_nothing() -> None:
    h = Harness()
    healthy_traffic(h, 120)
    assert h.codes() == []


def test_queueing_raises_on_persistent_waiting_and_ttft_growth_then_clears() -> None:
    h = Harness()
    healthy_traffic(h, 30)
    raised_at = None
    for i in range(20):
        h.set_waiting(6, age_s=1.5)
        h.feed(*[record(h.now - 2.0, ttft=1.2) for _ in range(3)])
        h.step()
        if "QUEUEING" in h.codes() and raised_at is None:
            raised_at = i
    assert raised_at is not None and raised_at <= 10
    msg = next(e for e in h.events if isinstance(e, WarningEvent) and e.code == "QUEUEING")
    assert "saturated" in msg.message and "TTFT p95" in msg.message
    h.set_waiting(0)
    cleared_after = None
    for i in range(40):
        h.feed(*[record(h.now - 1.0) for _ in range(5)])
        h.step()
        if "QUEUEING" in h.codes("cleared"):
            cleared_after = i
            break
    assert cleared_after is not None and 14 <= cleared_after <= 30


def test_kv_cache_full_and_preemptions() -> None:
    h = Harness()
    h.feed(EngineReading(t=h.now, kind="vllm", running=4, waiting=0, kv_cache_usage=0.5,
                         preemptions=0))
    h.step()
    h.step()
    assert "KV_CACHE" not in h.codes()
    for k in range(4):
        h.feed(EngineReading(t=h.now, kind="vllm", running=4, waiting=2, kv_cache_usage=0.99,
                             preemptions=k + 1))
        h.step()
    assert "KV_CACHE" in h.codes()


def test_gpu_memory_threshold() -> None:
    h = Harness()
    h.feed(GpuReading(t=h.now, index=0, name="g", mem_used_bytes=90, mem_total_bytes=100))
    for _ in range(4):
        h.step()
    assert h.codes() == []
    h.feed(GpuReading(t=h.now, index=0, name="g", mem_used_bytes=97, mem_total_bytes=100,
                      simulated=True))
    for _ in range(4):
        h.step()
    assert h.codes() == ["GPU_MEMORY"]
    ev = next(e for e in h.events if isinstance(e, WarningEvent))
    assert "97%" in ev.message and "simulated" in ev.message


def test_bandwidth_needs_rising_itl() -> None:
    h = Harness()
    healthy_traffic(h, 15)
    h.feed(GpuReading(t=h.now, index=0, name="g", mem_used_bytes=1, mem_total_bytes=100,
                      dram_bw_util=92.0))
    for _ in range(5):
        h.feed(*[record(h.now - 1.0) for _ in range(5)])
        h.step()
    assert "BANDWIDTH" not in h.codes(), "high bandwidth alone is not a warning"
    for _ in range(12):
        h.feed(*[record(h.now - 1.0, gap=0.05) for _ in range(5)])
        h.step()
    assert "BANDWIDTH" in h.codes()


def test_errors_burst() -> None:
    h = Harness()
    for _ in range(20):
        h.feed(*[record(h.now - 1.0) for _ in range(9)],
               record(h.now - 1.0, outcome="error", status=500))
        h.step()
    assert "ERRORS" in h.codes()


def test_upstream_down_is_immediate_and_clears() -> None:
    h = Harness()
    h.down = True
    h.step()
    assert h.codes() == ["UPSTREAM_DOWN"]
    h.down = False
    for _ in range(20):
        h.step()
    assert "UPSTREAM_DOWN" in h.codes("cleared")


def test_prefill_interference_needs_long_prompts() -> None:
    h = Harness()
    spiky = [0.02] * 40 + [0.4]
    for _ in range(15):
        h.feed(*[record(h.now - 1.0, gaps=spiky, prompt=50) for _ in range(4)])
        h.step()
    assert "PREFILL_INTERFERENCE" not in h.codes(), "spikes without long prompts"
    for _ in range(5):
        h.feed(*[record(h.now - 1.0, gaps=spiky, prompt=50) for _ in range(4)],
               record(h.now - 1.0, prompt=4000))
        h.step()
    assert "PREFILL_INTERFERENCE" in h.codes()


def test_slo_ttft_attainment() -> None:
    h = Harness()
    for _ in range(10):
        h.feed(*[record(h.now - 1.0, ttft=0.9) for _ in range(2)],
               *[record(h.now - 1.0, ttft=0.1) for _ in range(3)])
        h.step()
    assert "SLO_TTFT" in h.codes()
    assert "SLO_ITL" not in h.codes()
