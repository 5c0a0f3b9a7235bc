"""Saturation warnings: detect, explain, clear — without false alarms.

Each detector is a small function of the rolling :class:`Signals` returning evidence
(a message that names the figures and a likely remedy) when its condition holds, else
``None``. :class:`SaturationMonitor` adds hysteresis in time — a warning is raised after its
condition has held for ``warnings.raise_after_s`` and cleared only after it has been false
for ``warnings.clear_after_s`` — and in value: once a condition holds, it keeps holding at a
slightly lower level (``held``), so a reading hovering at a threshold does not flap. It
publishes :class:`~llmtop.events.WarningEvent` objects (raised / cleared) to the bus, from
where they reach the snapshot, the recording, Prometheus and the TUI.

Every duration derives from ``warnings.window_s`` (W): the detectors look at the last W
(queueing, bandwidth, prefill, preemptions), 2 W (errors) or 6 W (SLO attainment), so
compressing W compresses them all.

One incident, one warning: requests that failed while the upstream was unreachable (and in
the moments before, when its streams broke) are UPSTREAM_DOWN's, not ERRORS'; failed
requests are ERRORS', not the latency SLOs'.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

import numpy as np

from llmtop.clock import unix_now
from llmtop.config import Config
from llmtop.events import ActiveRequest, EngineReading, Event, Severity, WarningEvent
from llmtop.saturation.signals import Failure, Signals

Publish = Callable[[Event], None]

IMMEDIATE = frozenset({"UPSTREAM_DOWN"})
"""Codes raised on the first tick their condition holds (no raise delay)."""


SLO_REMEDY: Final = {
    "ttft": "requests wait or prefill too long: fewer concurrent requests, more "
            "replicas, shorter prompts",
    "itl": "decode steps too slow: a smaller batch (max_num_seqs), chunked prefill or "
           "a faster GPU",
    "e2e": "answers take too long: lower max_tokens, fewer concurrent requests or "
           "more replicas",
}
"""A likely remedy for each latency SLO, for its warning."""


@dataclass
class Verdict:
    message: str
    severity: Severity = "warning"


UPDATE_S = 5.0
"""A raised warning whose figures changed is published again at most this often."""


@dataclass
class _State:
    since_true: float | None = None
    since_false: float | None = None
    raised_at: float | None = None
    message: str = ""
    told_at: float = 0.0
    """When the message was last published (raised, or updated while raised)."""
    told: str = ""

    @property
    def held(self) -> bool:
        """The condition holds now (pending or raised): use the lower 'keep' thresholds."""
        return self.since_true is not None or self.raised_at is not None


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def wilson_upper(p: float, n: int, z: float = 1.645) -> float:
    """Upper end of the Wilson score interval of a proportion ``p`` seen in ``n`` trials
    (one-sided 95 % with the default ``z``)."""
    if n <= 0:
        return 1.0
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z2 / n))


def wilson_lower(p: float, n: int, z: float = 1.645) -> float:
    """Lower end of the Wilson score interval (one-sided 95 % with the default ``z``)."""
    return 1.0 - wilson_upper(1.0 - p, n, z)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class SaturationMonitor:
    """Evaluate every detector once per ``tick``; publish raise/clear transitions.

    ``active``: the proxy's open requests (read at each tick); ``upstream_down``: the
    proxy's "last connect failed" flag.
    """

    cfg: Config
    publish: Publish
    active: Mapping[str, ActiveRequest] = field(default_factory=dict)
    upstream_down: Callable[[], bool] = lambda: False
    signals: Signals = field(init=False)
    states: dict[str, _State] = field(default_factory=dict)
    outages: list[list[float]] = field(default_factory=list)
    """[start, end] of each upstream-down episode (end = +inf while it lasts)."""

    last_life: float | None = None
    """Unix time of the engine's last sign of life this monitor saw: a token to an open
    request, or a request it answered (UPSTREAM_STALLED)."""
    _now_ns: int = 0

    PREFILL_EVENTS: ClassVar[int] = 20
    """PREFILL_INTERFERENCE looks at this many of the latest long prompts ..."""
    PREFILL_STREAMS: ClassVar[int] = 16
    """... and at this many of the streams running at each one's start (bounded cost)."""

    def __post_init__(self) -> None:
        w = self.window_s
        self.signals = Signals(self.cfg.slo, keep_s=3 * w, tally_s=6 * w, slice_s=w / 10,
                               horizon_s=max(330.0, 33 * w),
                               engine_fresh_s=max(w / 2, 2.0 * self.cfg.engine.interval_s))

    @property
    def window_s(self) -> float:
        return float(self.cfg.warnings.window_s)

    # bus subscriber
    def on_events(self, batch: Sequence[Event]) -> None:
        self.signals.on_events(batch)

    def raised(self) -> dict[str, str]:
        """Codes raised now, with their current messages."""
        return {c: s.message for c, s in self.states.items() if s.raised_at is not None}

    def _held(self, code: str) -> bool:
        st = self.states.get(code)
        return st is not None and st.held

    def tick(self, now: float | None = None, now_ns: int | None = None) -> list[WarningEvent]:
        """Sample the open requests, evaluate every detector, publish and return the
        transitions. ``now``: unix time; ``now_ns``: the ``perf_counter_ns`` clock the
        proxy stamps ``ActiveRequest.t0_ns`` with."""
        now = unix_now() if now is None else now
        now_ns = time.perf_counter_ns() if now_ns is None else now_ns
        self._now_ns = now_ns
        sig = self.signals
        sig.sample(now, self.active, now_ns)
        window = sig.samples_in(now, self.window_s)
        queued = sum(1 for s in window if s.waiting >= 1)
        sig.remember_baselines(now, self.window_s, calm=queued <= 0.2 * len(window),
                               gaps_calm=not self._held("BANDWIDTH"))
        detectors: dict[str, Callable[[float, bool], Verdict | None]] = {
            # first: it marks the outage, which is neither QUEUEING nor ERRORS
            "UPSTREAM_DOWN": self.upstream,
            "UPSTREAM_STALLED": self.stalled,
            "QUEUEING": self.queueing,
            "SLO_TTFT": lambda t, h: self.slo(t, h, "ttft"),
            "SLO_ITL": lambda t, h: self.slo(t, h, "itl"),
            "SLO_E2E": lambda t, h: self.slo(t, h, "e2e"),
            "KV_CACHE": self.kv_cache,
            "GPU_MEMORY": self.gpu_memory,
            "BANDWIDTH": self.bandwidth,
            "ERRORS": self.errors,
            "PREFILL_INTERFERENCE": self.prefill_interference,
        }
        out: list[WarningEvent] = []
        for code, detect in detectors.items():
            ev = self._transition(code, detect(now, self._held(code)), now)
            if ev is not None:
                out.append(ev)
                self.publish(ev)
        return out

    def _transition(self, code: str, v: Verdict | None, now: float) -> WarningEvent | None:
        st = self.states.setdefault(code, _State())
        w = self.cfg.warnings
        if v is not None:
            st.since_false = None
            st.since_true = st.since_true if st.since_true is not None else now
            st.message = v.message
            immediate = code in IMMEDIATE
            if st.raised_at is None and (immediate or now - st.since_true >= w.raise_after_s):
                st.raised_at = st.told_at = now
                st.told = v.message
                return WarningEvent(now, code, v.severity, v.message, "raised")
            if (st.raised_at is not None and v.message != st.told
                    and now - st.told_at >= UPDATE_S):
                # still raised, with other figures: say them again (the raise time stays)
                st.told_at, st.told = now, v.message
                return WarningEvent(now, code, v.severity, v.message, "raised")
            return None
        st.since_true = None
        if st.raised_at is None:
            return None
        st.since_false = st.since_false if st.since_false is not None else now
        if now - st.since_false >= w.clear_after_s:
            st.raised_at = None
            st.since_false = None
            return WarningEvent(now, code, "info", f"cleared (last seen: {st.message})",
                                "cleared")
        return None

    # -- detectors ---------------------------------------------------------------------

    def _fresh_engine(self, now: float) -> EngineReading | None:
        """The engine's latest reading when it is at most a window old (KV_CACHE and
        GPU_MEMORY judge the KV cache by it), else None."""
        eng = self.signals.engine
        return eng if eng is not None and now - eng.t <= self.window_s else None

    def queueing(self, now: float, held: bool) -> Verdict | None:
        """The queue (engine waiting, or requests without a first token) stays non-empty
        through the last quarter window (at least two samples; with the raise delay,
        longer) while TTFT p95 has grown well past what the service does unloaded. A burst
        that the engine absorbs empties the queue between arrivals; saturation does not.
        Not during an outage (UPSTREAM_DOWN, until half a window after it): requests
        waiting for a connect that times out are not queued behind others.

        Without the engine's queue, this proxy's requests without a first token are a queue
        only while the engine is seen serving others in the same stretch (a stream flowing,
        a first token or an answer): one slow prefill alone in flight, or requests waiting
        on an upstream that answers nobody, is no queue (QA: both read "saturated")."""
        sig = self.signals
        win = self.window_s
        if self.outages and now <= self.outages[-1][1]:
            return None
        samples = sig.samples_in(now, win)
        if len(samples) < 3:
            return None
        recent = sig.samples_in(now, win / 4)
        if len(recent) < 2:
            recent = samples[-2:]
        queued = sum(1 for s in recent if s.waiting >= 1) / len(recent)
        if queued < (0.5 if held else 0.8):
            return None
        in_flight = sum(s.in_flight for s in recent) / len(recent)
        # never more "of them" than in flight: a sample's proxy_waiting ≤ its in_flight
        mine = sum(s.proxy_waiting for s in recent) / len(recent)
        engine = [s.engine_waiting for s in recent if s.engine_waiting is not None]
        if not engine and not sig.serving_since(min(recent[0].t, now - win / 4), recent):
            return None
        base = sig.ttft_baseline()
        p95 = sig.ttft_p95(now, win)
        oldest = max(s.oldest_waiting_s for s in recent)
        current = max(p95 or 0.0, oldest)
        slo = self.cfg.slo.ttft_s
        if base is None:
            if slo is None or current <= slo:
                return None
            base = min(p95 or current, slo)
        floor = 0.2 * (slo if slo is not None else 0.5)
        factor = 1.5 if held else 2.0
        if current < max(factor * base, base + floor):
            return None
        tps = sig.output_tps(now, win)
        here = (f"{in_flight:.0f} in flight, {mine:.0f} of them without a first token "
                "yet")
        if engine:
            # the engine's queue holds every client's requests, not only this proxy's:
            # each figure says whose it is
            queue = sum(engine) / len(engine)
            what = (f"engine queue {queue:.0f} (never empty for {win / 4:g} s); through "
                    f"this proxy {here}")
        else:
            what = f"{here} (queue never empty for {win / 4:g} s)"
        return Verdict(
            f"saturated: {what}; output {tps:.0f} tok/s; TTFT p95 "
            f"{_ms(base)}→{_ms(current)}; consider more replicas/routing or a concurrency "
            "limit"
        )


    def slo(self, now: float, held: bool, which: str) -> Verdict | None:
        """Attainment of one latency SLO over the requests judged on it in the last 6 W
        (answered, or cancelled after missing it) is below target beyond sampling noise:
        even the optimistic end of its one-sided 95 % confidence interval (Wilson) misses
        the target — 3 misses in 56 requests is what a service that meets 95 % does; 10 in
        56 is not. Once raised, it holds while the attainment itself stays below target,
        over however many requests the window holds (asking a raised warning for the ten a
        raise needs cleared and raised it again every minute or two at some ten requests a
        minute, every one of them missing the objective)."""
        slo = self.cfg.slo
        att, n = self.signals.slo_attainment(now, 6 * self.window_s, which)
        if att is None or (n < 10 and not held):
            return None
        if (att if held else wilson_upper(att, n)) >= slo.target:
            return None
        limit = {"ttft": slo.ttft_s, "itl": slo.itl_p95_s, "e2e": slo.e2e_s}[which]
        name = {"ttft": "TTFT", "itl": "ITL p95", "e2e": "E2E"}[which]
        assert limit is not None
        gave_up = self.signals.gave_up(now, 6 * self.window_s, which)
        whose = (f"{n} requests ({gave_up} of them cancelled by their clients after "
                 "missing it)" if gave_up else f"{n} answered requests")
        return Verdict(
            f"{name} SLO ≤ {_ms(limit)} met by {att:.0%} of the last {whose} "
            f"(target {slo.target:.0%}); {SLO_REMEDY[which]}"
        )

    def kv_cache(self, now: float, held: bool) -> Verdict | None:
        """Engine KV-cache usage at the threshold, or preemptions in the last W."""
        eng = self._fresh_engine(now)
        win = self.window_s
        if eng is None:
            return None
        pre = self.signals.preemptions_delta(now, win)
        usage = eng.kv_cache_usage
        thr = self.cfg.warnings.kv_cache_usage - (0.05 if held else 0.0)
        full = usage is not None and usage >= thr
        if not full and pre <= 0:
            return None
        parts = []
        if usage is not None:
            # preemptions free the pool they were in, so by the time they are counted the
            # usage can read low: "KV cache 0% full; 2 preemptions" (the report helper's
            # QA, where the engine's readings had reached 100 %) — its peak says why
            peak = self.signals.kv_peak(now, win)
            if pre > 0 and peak is not None and f"{peak:.0%}" != f"{usage:.0%}":
                parts.append(f"KV cache {usage:.0%} full ({peak:.0%} at most in {win:g} s)")
            else:
                parts.append(f"KV cache {usage:.0%} full")
        if pre > 0:
            parts.append(f"{_plural(round(pre), 'preemption')} in {win:g} s")
        return Verdict(
            "; ".join(parts) + " — requests are being recomputed or held back; shorter "
            "contexts, quantised KV, more memory or a lower max_num_seqs",
            "critical" if pre > 0 else "warning",
        )

    def gpu_memory(self, now: float, held: bool) -> Verdict | None:
        """A GPU's used / total memory at ``warnings.gpu_memory`` (held down 2 points) —
        and, when the engine's KV-cache usage is known (a fresh reading, at most a window
        old, from an engine that exports it: vLLM, SGLang, llama.cpp, the simulator), only
        while that usage is at ``warnings.kv_cache_usage`` too (held down 5 points, as
        KV_CACHE holds).

        Why: vLLM, SGLang and TGI reserve their KV-cache pool when they start (vLLM's
        ``--gpu-memory-utilization``, 0.9 by default; SGLang's ``--mem-fraction-static``),
        so NVML reads ~90 % used — 95 % and more as users often set it — from the first
        second, on an idle server. Memory used / total then says how big the reservation is, not how
        full it is; a warning raised from start-up on every idle server is one users learn
        to ignore. The engine's own gauge says how full the pool is. Memory at the threshold
        adds one thing to a full pool (KV_CACHE): the pool cannot be made bigger on this
        GPU — a higher ``gpu_memory_utilization`` will not fit — so the remedies are fewer
        KV bytes or more memory. A full pool on a GPU with room left is KV_CACHE's alone.

        Not chosen: "memory grew past its start-up reservation". A preallocating engine's
        footprint hardly moves after start-up, llmtop often starts after the engine (it
        never sees the reservation being made, so the baseline would be a guess, and a
        restart of llmtop moves it), and what grows past the pool (activations, another
        process) is not room for KV cache, which is what this warning is about.

        Without a KV reading (no engine metrics, a stale reading, or an engine that exports
        no KV usage: TGI, Ollama, an unrecognised one) memory alone decides, as before; the
        message says so, and that a preallocating engine reads full from start-up."""
        thr = self.cfg.warnings.gpu_memory - (0.02 if held else 0.0)
        worst: tuple[float, int] | None = None
        for g in self.signals.gpus.values():
            if g.mem_used_bytes is None or not g.mem_total_bytes:
                continue
            frac = g.mem_used_bytes / g.mem_total_bytes
            if frac >= thr and (worst is None or frac > worst[0]):
                worst = (frac, g.index)
        if worst is None:
            return None
        eng = self._fresh_engine(now)
        kv = eng.kv_cache_usage if eng is not None else None
        if kv is not None and kv < self.cfg.warnings.kv_cache_usage - (0.05 if held else 0.0):
            return None  # a reserved pool with room in it: not saturation
        g = self.signals.gpus[worst[1]]
        sim = " (simulated)" if g.simulated else ""
        gib = 1024**3
        used = (f"GPU {g.index}{sim} memory {worst[0]:.0%} used "
                f"({(g.mem_used_bytes or 0) / gib:.1f} of {(g.mem_total_bytes or 0) / gib:.1f} "
                "GiB)")
        if kv is not None:
            return Verdict(
                f"{used} and the engine's KV cache {kv:.0%} full — no room on this GPU to "
                "grow the KV cache (a higher gpu_memory_utilization will not fit); "
                "KV-cache quantisation (fp8), shorter contexts, a lower max_num_seqs or more "
                "memory (more GPUs: tensor parallelism)"
            )
        last = self.signals.engine
        if last is None:
            why = "no engine metrics"
        elif last.kv_cache_usage is None:
            why = (f"the engine ({last.kind}) exports no KV-cache usage" if last.kind
                   != "unknown" else "the upstream's /metrics name no engine llmtop knows")
        else:
            # a fixed text: an age that grows every tick would republish the warning
            why = f"the engine's KV-cache reading is stale (over {self.window_s:g} s old)"
        return Verdict(
            f"{used} — no room for more KV cache; quantisation, shorter contexts or more "
            f"memory (memory alone: {why}; an engine that reserves its KV cache at start-up, "
            "as vLLM, SGLang and TGI do, reads this full when idle — then its KV-cache "
            "usage is what tells)"
        )

    def bandwidth(self, now: float, held: bool) -> Verdict | None:
        """DRAM bandwidth (GPM; else memory busy time) at the threshold — now, and on
        average over the window whose chunk gaps are judged — while the chunk-gap p50 has
        risen 30 % over its baseline (held down to 20 %: scheduling noise moves a p50 by
        ~10 %): decode is memory-bound.

        Over the window: the gaps are those of the requests that ended in the last W, so
        they can be a stretch's when the bandwidth was far lower. QA (``llmtop sim``,
        concurrency 2, then 16, then 1): the saturated stretch read 51–59 % (compute-bound
        steps) with 19 ms gaps, the single stream after it 80 % with 12 ms gaps, and the
        last second's 80 % met the saturated gaps still in the window: "decode is
        memory-bound" at the run's lowest load."""
        thr = self.cfg.warnings.bandwidth_pct - (10.0 if held else 0.0)
        hot: list[str] = []
        sig = self.signals
        win = self.window_s
        for g in sig.gpus.values():
            bw, label, name = g.dram_bw_util, "DRAM bandwidth", "dram_bw_util"
            if bw is None:
                bw, label, name = g.mem_busy, "memory busy", "mem_busy"
            if bw is None or bw < thr:
                continue
            mean = sig.gpu_mean(g.index, now, win, name)
            if mean is not None and mean >= thr:
                hot.append(f"GPU {g.index} {label} {mean:.0f}% (mean over {win:g} s)")
        if not hot:
            return None
        base = self.signals.itl_baseline()
        cur = self.signals.itl_p50(now, self.window_s)
        if base is None or cur is None or cur < (1.2 if held else 1.3) * base:
            return None
        return Verdict(
            f"{', '.join(hot)} while ITL p50 rose {_ms(base)}→{_ms(cur)}: decode is "
            "memory-bound; smaller batches or contexts, quantisation or a faster GPU",
            "info",
        )

    def _in_outage(self, f: Failure) -> bool:
        return f.upstream_unreachable or any(a <= f.t_end <= b for a, b in self.outages)

    def errors(self, now: float, held: bool) -> Verdict | None:
        """Errors + timeouts among the requests of the last 2 W, outages excepted. Raised
        once the rate is surely at the threshold (the Wilson lower bound reaches it: 5 of
        90 requests is no evidence of a 5 % rate — QA saw a steady 1.7 % raise and clear
        it four times in 13 minutes), held down to half of it. A raise needs 3 failures,
        however few the requests: the bound weighs how little a few prove (3 of 3 failed
        reads ≥ 53 %), and a service under 1 req/s whose every answer is a 500 is failing
        (a floor of 20 requests kept ERRORS down there at any error rate). The evidence a
        raise needs is not asked of a raised warning: a steady 20 % whose traffic dipped
        (when the floor was there) cleared and raised it again every minute; held, it
        clears once the window's failures are under half the threshold's share of its
        requests, or there are none."""
        win = 2 * self.window_s
        # (requests lost with a dead --workers worker are WORKER_DOWN's: llmtop's failure,
        # not the engine's, and not requests the engine answered either)
        bad = [f for f in self.signals.failures_in(now, win)
               if not f.worker_lost and not self._in_outage(f)]
        n = self.signals.answered_in(now, win) + len(bad)
        if not bad or (not held and len(bad) < 3):
            return None
        rate = len(bad) / n
        thr = self.cfg.warnings.error_rate
        if (rate < thr / 2) if held else (wilson_lower(rate, n) < thr):
            return None
        timeouts = sum(1 for f in bad if f.outcome == "timeout")
        statuses: dict[int, int] = {}
        broke = own = 0
        for f in bad:
            if f.outcome != "error":
                continue
            if f.out_of_files:  # llmtop's own 502: not the engine's 5xx
                own += 1
            elif f.status < 400:  # the answer began (200) and its stream broke
                broke += 1
            else:
                statuses[f.status] = statuses.get(f.status, 0) + 1
        top = ", ".join([f"HTTP {s} ×{n}" for s, n in
                         sorted(statuses.items(), key=lambda kv: -kv[1])[:3]]
                        + ([f"{_plural(broke, 'stream')} broken mid-answer"] if broke else []))
        mine = f"{own} refused by llmtop, out of file descriptors" if own else ""
        what = "; ".join(x for x in (mine, top, _plural(timeouts, "timeout") if timeouts
                                     else "") if x)
        advice = ("see the engine's log — timeouts point at overload, 5xx at the engine, 4xx "
                  "at clients")
        if own:
            advice = ("llmtop's process has no file descriptor left for more streams: raise "
                      "its limit (ulimit -n; systemd LimitNOFILE=) or send fewer at once"
                      + (f"; for the rest, {advice}" if own < len(bad) else ""))
        return Verdict(
            f"{rate:.1%} of the last {n} requests failed ({what}; warns from {thr:.0%}); "
            f"{advice}",
            "critical",
        )

    def upstream(self, now: float, held: bool) -> Verdict | None:
        """The proxy's last connect failed, or the latest requests all found the upstream
        unreachable — unless, with no client request to tell, the engine's metrics answered
        after the last failed connect (the proxy's flag only resets on the next request).
        Marks the outage so its failures are not counted as ERRORS too."""
        sig = self.signals
        recent = sig.finished_in(now, self.window_s / 2)
        failing = [f for f in recent if f.upstream_unreachable]
        down = self.upstream_down() or (
            len(recent) >= 3 and all(f.upstream_unreachable for f in recent[-3:]))
        if down and not failing and sig.engine is not None \
                and now - sig.engine.t < sig.engine_fresh_s:
            last = max((f.t_end for f in sig.failures if f.upstream_unreachable),
                       default=None)
            down = last is not None and last >= sig.engine.t
        if not down:
            if self.outages and self.outages[-1][1] == float("inf"):
                self.outages[-1][1] = now + self.window_s / 2
            return None
        if not self.outages or self.outages[-1][1] != float("inf"):
            start = min((f.t_end for f in failing), default=now)
            # streams that broke as the upstream went away belong to the same incident
            self.outages.append([start - self.window_s / 2, float("inf")])
            del self.outages[:-8]
        where = self.cfg.upstream or "the upstream"
        timed_out = sum(1 for f in failing if f.status == 504)
        refused = len(failing) - timed_out
        if timed_out and not refused:
            how = (f"does not answer connection attempts ({_plural(timed_out, 'request')} "
                   f"timed out connecting in {self.window_s / 2:g} s)")
        elif timed_out:
            how = (f"refuses or drops connections ({_plural(refused, 'request')} got 502, "
                   f"{timed_out} timed out connecting in {self.window_s / 2:g} s)")
        else:
            how = (f"refuses connections ({_plural(refused, 'request')} got 502 in "
                   f"{self.window_s / 2:g} s)")
        return Verdict(
            f"upstream unreachable: {where} {how}; is the engine running and listening "
            "there, and is the host reachable?",
            "critical",
        )

    def stalled(self, now: float, held: bool) -> Verdict | None:
        """Streamed requests have waited ``warnings.stall_s`` for a first token and the
        engine gave no sign of life in that time — no token to any open request, no
        answer to any request (a first-byte timeout or the proxy's own 502/504 is none):
        a hung engine that accepts connections and never answers, which QUEUEING (no
        serving seen) and ERRORS (the first-byte timeout is minutes away) do not tell.
        Not while the upstream is unreachable (UPSTREAM_DOWN's). A warning, not critical,
        while a non-streamed request has been in flight all the silent time: its answer
        shows only when it ends, and a one-slot engine is silent while it generates."""
        now_ns = self._now_ns
        life = self.last_life if self.last_life is not None else now  # from the first tick
        # one copy (list() of the view runs in C, under the GIL): the proxy's thread adds
        # and removes requests meanwhile, and iterating the view itself raised "dictionary
        # changed size during iteration", which ended the observers' tick for good (the
        # soak helper's find: every later request stayed in the detectors' queues)
        actives = list(self.active.values())
        for a in actives:
            seen = a.last_chunk_ns or a.first_token_ns
            if seen:
                life = max(life, now - (now_ns - seen) / 1e9)
        answered = self.signals.last_answer
        if answered is not None and answered > life:
            life = answered
        self.last_life = life
        if self._held("UPSTREAM_DOWN"):
            return None
        stall = self.cfg.warnings.stall_s
        silent = now - life
        waiting = [(now_ns - a.t0_ns) / 1e9 for a in actives
                   if a.stream and a.first_token_ns is None]
        waited = [w for w in waiting if w >= stall]
        if silent < stall or not waited:
            return None
        where = self.cfg.upstream or "the upstream"
        whole = [(now_ns - a.t0_ns) / 1e9 for a in actives if not a.stream]
        if whole and max(whole) >= silent:
            # a non-streamed answer in flight all that time: nothing of it shows until it
            # ends, and an engine serving one request at a time (llama.cpp with one slot,
            # Ollama) is silent while it generates — said, not called hung (critical)
            return Verdict(
                f"engine silent: {_plural(len(waiting), 'streamed request')} waiting for a "
                f"first token (the oldest {max(waited):.0f} s) and nothing back from "
                f"{where} for {silent:.0f} s, while "
                f"{_plural(len(whole), 'non-streamed request')} "
                f"{'is' if len(whole) == 1 else 'are'} in flight (the oldest "
                f"{max(whole):.0f} s), "
                + ("whose answer shows only when it ends" if len(whole) == 1
                   else "whose answers show only when they end")
                + ": an engine serving one request at a time is busy — or it is hung "
                "(its logs)",
                "warning",
            )
        return Verdict(
            f"engine stalled: {_plural(len(waiting), 'streamed request')} waiting for a "
            f"first token (the oldest {max(waited):.0f} s) and nothing back from {where} "
            f"for {silent:.0f} s — no token, no answer: it accepts requests but does not "
            "serve them; is it hung? (its logs; a deadlocked engine needs a restart)",
            "critical",
        )

    def prefill_interference(self, now: float, held: bool) -> Verdict | None:
        """Running streams stall exactly when long prompts start: the chunk gaps that span
        a long prompt's first token (the end of its prefill step) are far above the
        window's gap p50. Random stalls that do not coincide with long prompts don't count.
        """
        sig = self.signals
        win = self.window_s
        if len(sig.prompts) < 5:
            return None
        median = float(np.median(np.fromiter(sig.prompts, dtype=float)))
        long_min = max(4 * median, 256)
        p50 = sig.itl_p50(now, win)
        if p50 is None or sig.gaps_in(now, win).size < 20:
            return None
        # a first token in the window means an end in it too: the window's own list (made
        # once a tick for the other checks) holds them all, not one twice as long
        events = [f for f in sig.finished_in(now, win)
                  if (f.prompt_tokens or 0) >= long_min and f.t_first is not None
                  and f.t_first >= now - win]
        if not events:  # (most ticks: the streams around them are not looked for)
            return None
        # a stream that spans a first token of the window ended in the window too
        streams = [r for r in sig.finished_in(now, win) if len(r.offsets) >= 3]
        spikes: list[float] = []
        stalled = 0
        for ev in events[-self.PREFILL_EVENTS:]:
            t_l = ev.t_first
            assert t_l is not None
            seen: list[float] = []
            for r in reversed(streams):  # the latest streams first; a sample is enough
                if r is ev or not r.t_start < t_l < r.t_end:
                    continue
                ct = r.chunk_t
                i = int(ct.searchsorted(t_l))  # ct[i-1] < t_l <= ct[i]
                if i < 1 or i >= ct.size:
                    continue
                # the gap that spans t_l, or the one before it when this stream's chunk of
                # the same step reached the proxy just before the long prompt's first token
                gap = float(ct[i] - ct[i - 1])
                if i >= 2:
                    gap = max(gap, float(ct[i - 1] - ct[i - 2]))
                seen.append(gap)
                if len(seen) >= self.PREFILL_STREAMS:
                    break
            if seen:
                spikes.append(statistics.median(seen))
                stalled += len(seen)
        if len(spikes) < (1 if held else 2):
            return None
        spike = statistics.median(spikes)
        floor = self.cfg.slo.itl_p95_s or 0.05
        if spike < max((2.0 if held else 3.0) * p50, floor):
            return None
        return Verdict(
            f"running streams stall {_ms(spike)} (chunk gap p50 {_ms(p50)}) when long "
            f"prompts (≥ {long_min:.0f} tokens) start: {_plural(len(spikes), 'long prompt')}"
            f" stalled {_plural(stalled, 'stream')} in {win:g} s; chunked prefill or "
            "a separate prefill pool",
            "info",
        )
