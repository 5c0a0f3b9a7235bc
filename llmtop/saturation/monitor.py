"""Saturation warnings: detect, explain, clear — without false alarms.

Each detector is a small function of the rolling :class:`Signals` returning evidence
(a message) when its condition holds, else ``None``. :class:`SaturationMonitor` adds
hysteresis — a warning is raised after its condition has held for ``raise_after_s`` and
cleared only after it has been false for ``clear_after_s`` — and publishes
:class:`~llmtop.events.WarningEvent` objects (raised / cleared) to the bus, from where they
reach the snapshot, the recording, Prometheus and the TUI.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmtop.config import Config
from llmtop.events import ActiveRequest, Event, Severity, WarningEvent
from llmtop.saturation.signals import Signals

Publish = Callable[[Event], None]


@dataclass
class Verdict:
    message: str
    severity: Severity = "warning"


@dataclass
class _State:
    since_true: float | None = None
    since_false: float | None = None
    raised_at: float | None = None
    message: str = ""


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


@dataclass
class SaturationMonitor:
    """Evaluate every detector once per ``tick``; publish raise/clear transitions."""

    cfg: Config
    publish: Publish
    active: Mapping[str, ActiveRequest] = field(default_factory=dict)
    upstream_down: Callable[[], bool] = lambda: False
    raise_after_s: float = 2.0
    signals: Signals = field(default_factory=Signals)
    states: dict[str, _State] = field(default_factory=dict)

    # bus subscriber
    def on_events(self, batch: Sequence[Event]) -> None:
        self.signals.on_events(batch)

    def raised(self) -> dict[str, str]:
        """Codes raised now, with their current messages."""
        return {c: s.message for c, s in self.states.items() if s.raised_at is not None}

    def tick(self, now: float | None = None, now_ns: int | None = None) -> list[WarningEvent]:
        now = time.time() if now is None else now
        now_ns = time.perf_counter_ns() if now_ns is None else now_ns
        w = self.cfg.warnings
        self.signals.sample(now, self.active, now_ns)
        self.signals.remember_baselines(now, w.window_s)
        verdicts: dict[str, Verdict | None] = {
            "QUEUEING": self.queueing(now),
            "SLO_TTFT": self.slo(now, "ttft"),
            "SLO_ITL": self.slo(now, "itl"),
            "SLO_E2E": self.slo(now, "e2e"),
            "KV_CACHE": self.kv_cache(now),
            "GPU_MEMORY": self.gpu_memory(),
            "BANDWIDTH": self.bandwidth(now),
            "ERRORS": self.errors(now),
            "UPSTREAM_DOWN": self.upstream(now),
            "PREFILL_INTERFERENCE": self.prefill_interference(now),
        }
        out: list[WarningEvent] = []
        for code, verdict in verdicts.items():
            ev = self._transition(code, verdict, now)
            if ev is not None:
                out.append(ev)
                self.publish(ev)
        return out

    def _transition(self, code: str, v: Verdict | None, now: float) -> WarningEvent | None:
        st = self.states.setdefault(code, _State())
        clear_after = self.cfg.warnings.clear_after_s
        if v is not None:
            st.since_false = None
            st.since_true = st.since_true if st.since_true is not None else now
            st.message = v.message
            immediate = code in ("UPSTREAM_DOWN",)
            if st.raised_at is None and (immediate or now - st.since_true >= self.raise_after_s):
                st.raised_at = now
                return WarningEvent(now, code, v.severity, v.message, "raised")
            return None
        st.since_true = None
        if st.raised_at is None:
            return None
        st.since_false = st.since_false if st.since_false is not None else now
        if now - st.since_false >= clear_after:
            st.raised_at = None
            st.since_false = None
            return WarningEvent(now, code, "info", f"cleared: {st.message}", "cleared")
        return None

    # -- detectors ---------------------------------------------------------------------

    def queueing(self, now: float) -> Verdict | None:
        """Requests wait (engine queue, or no first token at the proxy) persistently while
        TTFT p95 has grown well past what the service does unloaded."""
        sig = self.signals
        win = self.cfg.warnings.window_s
        samples = sig.samples_in(now, win)
        if len(samples) < 3:
            return None
        waiting = sum(s.waiting for s in samples) / len(samples)
        in_flight = sum(s.in_flight for s in samples) / len(samples)
        if waiting < 1.0 or waiting < 0.1 * in_flight:
            return None
        base = sig.ttft_baseline()
        p95 = sig.ttft_p95(now, win)
        oldest = max(s.oldest_waiting_s for s in samples)
        current = max(p95 or 0.0, oldest)
        if base is None:
            slo = self.cfg.slo.ttft_s
            if slo is None or current <= slo:
                return None
            base = min(p95 or current, slo)
        if current < max(2.0 * base, base + 0.1):
            return None
        tps = sig.output_tps(now, win)
        return Verdict(
            f"saturated: {in_flight:.0f} in flight, +{waiting:.0f} of them only waiting; "
            f"output {tps:.0f} tok/s; TTFT p95 {_ms(base)}→{_ms(current)}; "
            "consider more replicas/routing or a concurrency limit"
        )

    def slo(self, now: float, which: str) -> Verdict | None:
        slo = self.cfg.slo
        att, n = self.signals.slo_attainment(now, 60.0, slo, which)
        if att is None or n < 10 or att >= slo.target:
            return None
        limit = {"ttft": slo.ttft_s, "itl": slo.itl_p95_s, "e2e": slo.e2e_s}[which]
        name = {"ttft": "TTFT", "itl": "ITL p95", "e2e": "E2E"}[which]
        assert limit is not None
        return Verdict(
            f"{name} SLO ≤ {_ms(limit)} met by {att:.0%} of the last {n} requests "
            f"(target {slo.target:.0%})"
        )

    def kv_cache(self, now: float) -> Verdict | None:
        eng = self.signals.engine
        if eng is None or now - eng.t > 10.0:
            return None
        pre = self.signals.preemptions_delta(now, 30.0)
        usage = eng.kv_cache_usage
        full = usage is not None and usage >= self.cfg.warnings.kv_cache_usage
        if not full and pre <= 0:
            return None
        parts = []
        if usage is not None:
            parts.append(f"KV cache {usage:.0%} full")
        if pre > 0:
            parts.append(f"{pre:.0f} preemptions in 30 s")
        return Verdict(
            "; ".join(parts) + " — requests are being recomputed or held back; shorter "
            "contexts, quantised KV, more memory or a lower max_num_seqs",
            "critical" if pre > 0 else "warning",
        )

    def gpu_memory(self) -> Verdict | None:
        worst: tuple[float, int] | None = None
        for g in self.signals.gpus.values():
            if g.mem_used_bytes is None or not g.mem_total_bytes:
                continue
            frac = g.mem_used_bytes / g.mem_total_bytes
            if frac >= self.cfg.warnings.gpu_memory and (worst is None or frac > worst[0]):
                worst = (frac, g.index)
        if worst is None:
            return None
        g = self.signals.gpus[worst[1]]
        sim = " (simulated)" if g.simulated else ""
        return Verdict(
            f"GPU {g.index}{sim} memory {worst[0]:.0%} used — no room for more KV cache; "
            "quantisation, shorter contexts or more memory"
        )

    def bandwidth(self, now: float) -> Verdict | None:
        thr = self.cfg.warnings.bandwidth_pct
        hot: list[str] = []
        for g in self.signals.gpus.values():
            bw, label = g.dram_bw_util, "DRAM bandwidth"
            if bw is None:
                bw, label = g.mem_busy, "memory busy"
            if bw is not None and bw >= thr:
                hot.append(f"GPU {g.index} {label} {bw:.0f}%")
        if not hot:
            return None
        base = self.signals.itl_baseline()
        cur = self.signals.itl_p50(now, self.cfg.warnings.window_s)
        if base is None or cur is None or cur < 1.2 * base:
            return None
        return Verdict(
            f"{', '.join(hot)} while ITL p50 rose {_ms(base)}→{_ms(cur)}: decode is "
            "memory-bound; smaller batches, quantisation or a faster GPU",
            "info",
        )

    def errors(self, now: float) -> Verdict | None:
        rows = [f for f in self.signals.finished_in(now, 60.0) if f.outcome != "cancelled"]
        bad = [f for f in rows if f.outcome in ("error", "timeout")]
        if len(rows) < 10 or len(bad) < 3:
            return None
        rate = len(bad) / len(rows)
        if rate < self.cfg.warnings.error_rate:
            return None
        timeouts = sum(1 for f in bad if f.outcome == "timeout")
        return Verdict(
            f"{rate:.1%} of the last {len(rows)} requests failed ({len(bad) - timeouts} errors,"
            f" {timeouts} timeouts)",
            "critical",
        )

    def upstream(self, now: float) -> Verdict | None:
        if self.upstream_down():
            return Verdict("upstream unreachable: clients get 502", "critical")
        recent = self.signals.finished_in(now, 5.0)
        if recent and all(f.upstream_unreachable for f in recent[-3:]) and len(recent) >= 3:
            return Verdict("upstream unreachable: clients get 502", "critical")
        return None

    def prefill_interference(self, now: float) -> Verdict | None:
        win = self.cfg.warnings.window_s
        p50, p99 = self.signals.gap_percentiles(now, win)
        if p50 is None or p99 is None or p99 < 5 * p50 or p99 < 0.05:
            return None
        rows = self.signals.finished_in(now, 60.0)
        prompts = sorted(f.prompt_tokens for f in rows if f.prompt_tokens)
        if len(prompts) < 5:
            return None
        median = prompts[len(prompts) // 2]
        long_ = [f for f in self.signals.finished if f.t_start >= now - win - 30
                 and (f.prompt_tokens or 0) >= max(4 * median, 256)]
        if not long_:
            return None
        return Verdict(
            f"chunk gap p99 {_ms(p99)} vs p50 {_ms(p50)}: {len(long_)} long prompts "
            f"(≥ {max(4 * median, 256)} tokens) stall running streams; chunked prefill or a "
            "separate prefill pool",
            "info",
        )
