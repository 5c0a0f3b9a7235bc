"""The simulated continuous-batching engine: one scheduler task stepping in (scaled) real time.

Each step, in vLLM V1's order:

1. every running sequence reserves KV for the token(s) it will emit this step; when the KV
   cache cannot hold them, the *newest* running request is preempted back to the front of
   the queue (its KV is freed; it will recompute prompt + generated tokens), counted;
2. if nothing was preempted, waiting requests are admitted first-come-first-served while a
   sequence slot (``max_num_seqs``) and KV for their context + 1 token are free; each pays
   its prefill (context tokens ÷ ``prefill_tokens_per_s``) inside this step, which delays
   every running sequence's next token, as real engines without chunked prefill do;
3. the step lasts ``base + per_seq × batch + per_kv_token × context + prefill`` (times
   ``time_scale``); then every running sequence emits its next ``tokens_per_chunk`` tokens
   (the first token of a request comes out of its prefill step) and finished ones leave.

Handlers wait on a per-request :class:`asyncio.Event` and a deque of chunk sizes; there is
no per-token task or busy loop. Firehose mode drops pacing *and* limits: every request is
admitted at once and steps follow each other as fast as the event loop turns.

Ground truth for tests: :meth:`SimEngine.records` (the last 10,000 requests),
:meth:`SimEngine.state`, :meth:`SimEngine.gpu`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import random
import time
from collections import deque
from typing import Any

from llmtop.sim.profiles import SimProfile
from llmtop.sim.tokens import VOCAB, sample_output_len

WAITING, RUNNING, FINISHED, CANCELLED, ABORTED = (
    "waiting", "running", "finished", "cancelled", "aborted",
)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""vLLM's buckets for ``vllm:time_to_first_token_seconds``."""
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vLLM's buckets for ``vllm:e2e_request_latency_seconds``."""

HISTORY = 10_000
GPU_WINDOW_S = 1.0
FIREHOSE_SPAN_S = 0.01
"""In firehose mode a step is a loop turn (thousands a second): the busy time of the turns
is logged a span of at least this long at a time, so that the step log (4,096 entries)
covers the utilisation window."""

log = logging.getLogger("llmtop.sim")


class SimRequestError(ValueError):
    """A request the engine refuses (HTTP 400), e.g. longer than ``max_model_len``."""


class EngineClosed(RuntimeError):
    """The engine has been stopped (HTTP 503)."""


class Histogram:
    """Bucket counts (non-cumulative), sum and count of observations."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, cumulative count), ...]`` ending with ``+Inf``."""
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        return out


class SimRequest:
    """One request inside the engine. The handler reads ``out`` (chunk sizes in tokens) after
    ``event`` is set, until ``state`` is terminal and ``out`` is empty."""

    __slots__ = (
        "admitted", "arrival", "cancelled_at", "chunks", "event", "finish_reason",
        "finished", "first_token", "generated", "id", "kv_held", "num", "out",
        "path", "preemptions", "prompt_tokens", "state", "step_k", "stream", "target",
        "text_offset",
    )

    def __init__(self, num: int, rid: str, path: str, stream: bool, prompt_tokens: int,
                 target: int, finish_reason: str, text_offset: int) -> None:
        self.num = num
        self.id = rid
        self.path = path
        self.stream = stream
        self.prompt_tokens = prompt_tokens
        self.target = target
        self.finish_reason = finish_reason
        """``length`` when the client's max_tokens ended it, ``stop`` for a sampled length."""
        self.text_offset = text_offset
        self.generated = 0
        self.state = WAITING
        self.arrival = time.time()
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self.cancelled_at: float | None = None
        self.preemptions = 0
        self.chunks: list[float] = []
        """Wall times the server wrote each content chunk (streaming responses only)."""
        self.out: deque[int] = deque()
        self.event = asyncio.Event()
        self.kv_held = 0
        self.step_k = 0

    @property
    def done(self) -> bool:
        """True once the engine will emit nothing more for this request."""
        return self.state in (FINISHED, CANCELLED, ABORTED)

    def to_dict(self) -> dict[str, Any]:
        """The ground-truth record served at ``/sim/requests``."""
        return {
            "id": self.id, "path": self.path, "stream": self.stream, "state": self.state,
            "arrival": self.arrival, "admitted": self.admitted,
            "first_token": self.first_token, "finished": self.finished,
            "cancelled_at": self.cancelled_at, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.generated, "max_tokens": self.target,
            "preemptions": self.preemptions, "chunks": list(self.chunks),
        }


class SimEngine:
    """The scheduler. Create it, ``await start()``, ``submit()`` requests, ``await stop()``.

    Also usable in-process as ground truth: :meth:`state`, :meth:`records`, :meth:`gpu`.
    """

    def __init__(self, profile: SimProfile, *, firehose: bool = False, seed: int = 0,
                 id_salt: int = 0) -> None:
        self.profile = profile
        self.firehose = firehose
        self._rng = random.Random(seed)
        self._id_salt = id_salt & ((1 << 96) - 1)
        """XORed into every request id: processes sharing a port (``--reuse-port``) with
        one seed would otherwise hand out the same ids (the rest stays the seed's)."""
        self._num = 0
        self._waiting: deque[SimRequest] = deque()
        self._running: dict[int, SimRequest] = {}
        self._kv_used = 0
        self._records: deque[SimRequest] = deque(maxlen=HISTORY)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._steps: deque[tuple[float, float, float, float]] = deque(maxlen=4096)
        """(monotonic end, wall time busy, DRAM bandwidth fraction, memory-busy fraction).
        Back-to-back steps tile the time line: a step is busy from the previous one's end
        (or from the wake-up that started it), so a stalled host process (a pause, a
        blocked loop) stretches the step it delays instead of reading as an idle GPU. In
        firehose mode, spans of loop turns (:data:`FIREHOSE_SPAN_S`)."""
        self.last_step_s = 0.0
        """Wall duration of the latest step (scaled by time_scale; 0 in firehose mode)."""
        self.steps = 0
        self.preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        """Finished requests by vLLM V1's ``finished_reason``; a cancellation is ``abort``."""
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start the scheduler task on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Stop stepping; every unfinished request is marked aborted and its handler woken;
        later submissions raise :class:`EngineClosed`."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._abort_all()

    def _abort_all(self) -> None:
        for req in (*self._waiting, *self._running.values()):
            req.state = ABORTED
            req.kv_held = 0
            req.event.set()
        self._waiting.clear()
        self._running.clear()
        self._kv_used = 0

    # -- requests ----------------------------------------------------------------------
    def submit(self, *, path: str, stream: bool, prompt_tokens: int, max_tokens: int | None,
               id_prefix: str = "sim-") -> SimRequest:
        """Queue a request. ``max_tokens`` None: the length is drawn from the profile's
        distribution and the request ends with finish_reason ``stop`` (``length`` when
        that length does not fit in ``max_model_len`` and is cut there); otherwise exactly
        ``max_tokens`` tokens are generated (ignore_eos) and it ends with ``length``.

        Raises :class:`SimRequestError` when prompt + output exceed ``max_model_len``, and
        :class:`EngineClosed` after :meth:`stop`.
        """
        if self._closed:
            raise EngineClosed("the simulated engine is shutting down")
        p = self.profile
        if max_tokens is not None and max_tokens < 1:
            raise SimRequestError(f"max_tokens must be at least 1, got {max_tokens}")
        if max_tokens is None:
            if prompt_tokens >= p.max_model_len:
                raise SimRequestError(
                    f"This model's maximum context length is {p.max_model_len} tokens. "
                    f"However, your request has {prompt_tokens} input tokens."
                )
            target = sample_output_len(self._rng, p.output_tokens_dist, p.output_tokens_mean)
            # cut by the end of the context: vLLM's max_tokens is then what the context has
            # left, and an answer that reaches it ends with "length", not "stop"
            left = p.max_model_len - prompt_tokens
            target, reason = (target, "stop") if target <= left else (left, "length")
        else:
            if prompt_tokens + max_tokens > p.max_model_len:
                raise SimRequestError(
                    f"This model's maximum context length is {p.max_model_len} tokens. "
                    f"However, you requested {prompt_tokens + max_tokens} tokens "
                    f"({prompt_tokens} in the messages, {max_tokens} in the completion)."
                )
            target, reason = max_tokens, "length"
        self._num += 1
        rid = f"{id_prefix}{self._rng.getrandbits(96) ^ self._id_salt:024x}"
        req = SimRequest(self._num, rid, path, stream, prompt_tokens, target, reason,
                         self._rng.randrange(len(VOCAB)))
        self._records.append(req)
        self._waiting.append(req)
        self._wake.set()
        return req

    def cancel(self, req: SimRequest) -> None:
        """The client went away: drop the request from the queue or the batch (frees its KV)
        and record ``cancelled_at``. No-op for a request that is already done."""
        if req.done:
            return
        if req.state == WAITING:
            with contextlib.suppress(ValueError):
                self._waiting.remove(req)
        elif self._running.pop(req.num, None) is not None:
            self._kv_used -= req.kv_held
            req.kv_held = 0
        req.state = CANCELLED
        req.cancelled_at = time.time()
        self.success["abort"] += 1
        req.event.set()

    # -- the scheduler -----------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self._loop()
            except Exception:  # a bug must not leave every client hanging
                log.exception("llmtop sim: engine step failed; in-flight requests dropped")
                self._abort_all()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = busy_from = loop.time()
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                next_t = busy_from = loop.time()
            model_s, bw_frac, busy_frac = self._plan()
            if not self._running:
                # nothing admissible right now (only possible transiently): wait for news
                self._wake.clear()
                await self._wake.wait()
                busy_from = loop.time()
                continue
            if self.firehose:
                self.last_step_s = 0.0
                await asyncio.sleep(0)
            else:
                dur = model_s * self.profile.time_scale
                now = loop.time()
                # keep the long-run rate exact despite timer overshoot, but never burst to
                # catch up after a real stall
                start = next_t if now - next_t < 0.005 else now
                next_t = start + dur
                self.last_step_s = dur
                await asyncio.sleep(max(0.0, next_t - now))
            end = loop.time()
            if not self.firehose or end - busy_from >= FIREHOSE_SPAN_S:
                self._steps.append((end, end - busy_from, bw_frac, busy_frac))
                busy_from = end
            self._emit()

    def _plan(self) -> tuple[float, float, float]:
        """Reserve KV / preempt, admit, and price the step. Returns (model seconds, DRAM
        bandwidth fraction, memory-busy fraction)."""
        p = self.profile
        running = self._running
        tpc = p.tokens_per_chunk
        limits = not self.firehose
        grow = 0
        for r in running.values():
            r.step_k = min(tpc, r.target - r.generated)
            grow += r.step_k
        preempted = False
        while limits and self._kv_used + grow > p.kv_cache_tokens and len(running) > 1:
            victim = running.pop(next(reversed(running)))
            self._kv_used -= victim.kv_held
            grow -= victim.step_k
            victim.kv_held = victim.step_k = 0
            victim.state = WAITING
            victim.preemptions += 1
            self.preemptions += 1
            self._waiting.appendleft(victim)
            preempted = True
        for r in running.values():
            r.kv_held += r.step_k
        self._kv_used += grow
        prefill = 0
        wall = 0.0
        while self._waiting and not preempted:
            r = self._waiting[0]
            ctx = r.prompt_tokens + r.generated
            if limits and (len(running) >= p.max_num_seqs
                           or self._kv_used + ctx + 1 > p.kv_cache_tokens):
                break
            self._waiting.popleft()
            r.state = RUNNING
            r.step_k = 1
            r.kv_held = ctx + 1
            self._kv_used += ctx + 1
            prefill += ctx
            if r.admitted is None:
                wall = wall or time.time()
                r.admitted = wall
                self.prompt_tokens_total += r.prompt_tokens
            running[r.num] = r
        context = self._kv_used
        prefill_s = prefill / p.prefill_tokens_per_s
        model_s = (p.base_step_s + p.per_seq_s * len(running) + p.per_kv_token_s * context
                   + prefill_s)
        if model_s <= 0:
            return 0.0, 0.0, 0.0
        read = p.weights_bytes + p.kv_bytes_per_token * context
        bw_frac = min(1.0, read / model_s / p.peak_bw_bytes_per_s)
        busy_frac = max(bw_frac, 1.0 - prefill_s / model_s)
        return model_s, bw_frac, busy_frac

    def _emit(self) -> None:
        wall = time.time()
        self.steps += 1
        finished = []
        for r in self._running.values():
            k = r.step_k
            if k <= 0:
                continue
            r.generated += k
            self.generation_tokens_total += k
            if r.first_token is None:
                r.first_token = wall
                self.ttft.observe(wall - r.arrival)
            r.out.append(k)
            if r.generated >= r.target:
                finished.append(r)
            r.event.set()
        for r in finished:
            del self._running[r.num]
            self._kv_used -= r.kv_held
            r.kv_held = 0
            r.state = FINISHED
            r.finished = wall
            self.success[r.finish_reason] += 1
            self.e2e.observe(wall - r.arrival)

    # -- ground truth ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """``{running, waiting, kv_tokens_used, kv_tokens_total, preemptions, step_s}``."""
        return {
            "running": len(self._running),
            "waiting": len(self._waiting),
            "kv_tokens_used": self._kv_used,
            "kv_tokens_total": self.profile.kv_cache_tokens,
            "preemptions": self.preemptions,
            "step_s": self.last_step_s,
        }

    def records(self) -> list[dict[str, Any]]:
        """Per-request records of the last 10,000 requests, oldest first."""
        return [r.to_dict() for r in self._records]

    @property
    def kv_usage(self) -> float:
        """KV-cache usage, 0–1."""
        return min(1.0, self._kv_used / self.profile.kv_cache_tokens)

    def gpu(self) -> dict[str, Any]:
        """The simulated GPU over the last second, in the ``/sim/gpu`` shape (one entry)."""
        p = self.profile
        now = time.monotonic()
        cutoff = now - GPU_WINDOW_S
        busy = bw = mem = 0.0
        for end, dur, bw_frac, busy_frac in reversed(self._steps):
            if end <= cutoff:
                break
            overlap = min(dur, end - cutoff)
            busy += overlap
            bw += overlap * bw_frac
            mem += overlap * busy_frac
        util = min(100.0, 100.0 * busy / GPU_WINDOW_S)
        dram = min(100.0, 100.0 * bw / GPU_WINDOW_S)
        mem_busy = min(100.0, 100.0 * mem / GPU_WINDOW_S)
        kv_bytes = min(self._kv_used, p.kv_cache_tokens) * p.kv_bytes_per_token
        return {
            "index": 0,
            "name": f"Simulated {p.model} on {p.gpu_name} (llmtop sim)",
            "mem_used_bytes": int(p.runtime_overhead_bytes + p.weights_bytes + kv_bytes),
            "mem_total_bytes": int(p.mem_total_bytes),
            "util_gpu": round(util, 2),
            "mem_busy": round(mem_busy, 2),
            "dram_bw_util": round(dram, 2),
            # linear in busy time and bandwidth: idle board → TDP at full bandwidth
            "power_w": round(p.power_idle_w + (p.power_max_w - p.power_idle_w)
                             * (0.3 * util + 0.7 * dram) / 100.0, 1),
            "simulated": True,
        }
