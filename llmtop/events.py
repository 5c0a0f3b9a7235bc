"""The small records that flow one way through llmtop.

proxy → (RequestRecord, ActiveRequest) → metrics → snapshots → TUI / recording / Prometheus.
The proxy adds ChunkSlice (an open stream's latest chunks, for the metrics only); samplers
add GpuReading and EngineReading; detectors add WarningEvent.

This module imports nothing of ours. Field names and units follow the recording format in
``shared/docs/interfaces.md``: times in seconds (floats), unix time for wall-clock instants,
percentages 0–100 for GPU utilisations, a 0–1 fraction for KV-cache usage.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import Any, Final, Literal, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

Dialect: TypeAlias = Literal["openai", "anthropic", "ollama", "tgi", "sglang", "other"]
Outcome: TypeAlias = Literal["ok", "error", "cancelled", "timeout"]
TokenSource: TypeAlias = Literal["usage", "chunks", "estimate"]
Severity: TypeAlias = Literal["info", "warning", "critical"]
WarningState: TypeAlias = Literal["raised", "cleared"]

DIALECTS: Final = ("openai", "anthropic", "ollama", "tgi", "sglang", "other")
OUTSIDE_DIALECTS: Final = ("openai", "anthropic", "ollama", "tgi", "other")
"""The ``dialect`` values the recording and the admin API may carry: the outside contract
(shared/docs/interfaces.md) lists these and no others, and tools written against it may
treat the list as closed. A dialect the proxy tells apart beyond them (``sglang``: SGLang's
native ``/generate``) is written as ``other`` — what the page calls an API it does not
list; its ``path`` still says which."""


def outside_dialect(dialect: str) -> str:
    """``dialect`` as the recording and the admin API write it (:data:`OUTSIDE_DIALECTS`)."""
    return "other" if dialect == "sglang" else dialect
OUTCOMES: Final = ("ok", "error", "cancelled", "timeout")
WARNING_CODES: Final = (
    "QUEUEING", "SLO_TTFT", "SLO_ITL", "SLO_E2E", "KV_CACHE", "GPU_MEMORY", "BANDWIDTH",
    "ERRORS", "UPSTREAM_DOWN", "UPSTREAM_STALLED", "PREFILL_INTERFERENCE",
)
"""Every saturation warning code (llmtop.saturation raises them; /metrics exports each)."""
OPERATIONAL_CODES: Final = ("WORKER_DOWN", "EVENTS_LOST", "OUT_OF_FILES")
"""Warnings about llmtop itself, not the service (``WORKER_DOWN``: a ``--workers`` process
exited or stopped reporting; raised by :mod:`llmtop.worker_procs`, cleared once it serves
again. ``EVENTS_LOST``: a worker dropped events its coordinator could not take, so figures
read low; raised by :mod:`llmtop.workers`. ``OUT_OF_FILES``: a process of the proxy has no
file descriptor free, so new clients are closed unanswered; raised by
:mod:`llmtop.out_of_files_warning`, cleared once it has had descriptors for a while)."""


UNREACHABLE_PREFIX: Final = "upstream unreachable"
"""How the proxy's ``error`` for a request it could not connect upstream begins."""

OUT_OF_FILES_PREFIX: Final = "out of file descriptors"
"""How the proxy's ``error`` begins for a request it answered 502 because its own process
had no file descriptor left for the upstream socket (llmtop's limit, not the engine's:
:mod:`llmtop.out_of_files`)."""

WORKER_EXIT_PREFIX: Final = "llmtop worker "
"""How the coordinator's ``error`` begins for a request lost with a ``--workers`` worker
that exited (``llmtop worker 1 exited (killed by SIGKILL) …``: :mod:`llmtop.worker_procs`):
llmtop's own failure, WORKER_DOWN's, not the engine's (ERRORS leaves it out)."""

CONNECT_TIMEOUT_PREFIX: Final = "upstream connect timed out"
"""How the proxy's ``error`` begins for a request whose upstream connect timed out (a 504
of its own: the upstream host does not answer connection attempts at all)."""


def counter_rise(prev: float, cur: float) -> float:
    """What a counter (an engine's preemptions) rose by from one reading to the next: a
    reading below the last is a restart that reset it, so all of it is new."""
    return cur - prev if cur >= prev else cur


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request, exactly the recording's ``request`` line (less ``type``).

    ``chunk_offsets_s[i]`` is when content chunk *i* was written to the client, in seconds
    since ``t_start``; ``chunk_tokens[i]`` how many output tokens it carried (when the
    engine's usage is known, the per-chunk counts are scaled so they sum to it).
    """

    id: str
    user: str
    model: str | None
    dialect: Dialect
    path: str
    stream: bool
    status: int
    outcome: Outcome
    t_start: float
    ttft_s: float | None
    e2e_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    token_source: TokenSource
    chunk_offsets_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    concurrency_at_start: int = 0
    error: str | None = None
    upstream_id: str | None = None
    """The engine's own id of the request, to look it up in the engine's logs: the
    response's ``X-Request-Id`` header when it has one, else the id its body names
    (OpenAI-style ``chatcmpl-…``/``cmpl-…``/``resp_…``, Anthropic ``msg_…``, SGLang's
    ``/generate`` ``meta_info.id``); None when neither (Ollama, TGI's native API, an
    answer the proxy made itself); ``llmtop bench``'s records the same, as its client read
    the answer. At most 128 characters; not secret, no prompt text. (Last: recordings and
    wires without it read as None.)"""

    # -- derived figures (definitions in shared/docs/domain.md) --------------------------

    @property
    def upstream_unreachable(self) -> bool:
        """The proxy could not connect to the upstream for this request — refused (a 502 of
        its own) or the connect timed out (its 504: a host that drops connection attempts
        is as down as one that refuses them): an outage, not an answer under load."""
        if self.ttft_s is not None:
            return False
        if self.status == 502:
            return self.error is None or self.error.startswith(UNREACHABLE_PREFIX)
        return (self.status == 504 and self.error is not None
                and self.error.startswith(CONNECT_TIMEOUT_PREFIX))

    def chunk_gaps_s(self) -> list[float]:
        """Gaps between consecutive content-bearing chunks."""
        offs = self.chunk_offsets_s
        return [offs[i] - offs[i - 1] for i in range(1, len(offs))]

    def itl_samples_s(self) -> list[float]:
        """Inter-token latency: a chunk with k > 0 tokens gives k samples of g/k, where g is
        its time since the previous chunk that carried tokens — or since chunk 0, the first
        chunk, whatever its count (a chunk with no count is 1 token). A chunk with k <= 0
        (counts scaled down to the engine's usage can give a chunk 0) gives no sample and
        takes no time: the next token-carrying chunk's gap spans it. So the samples sum to
        ``offs[last token-carrying chunk] − offs[0]`` and mean ITL agrees with TPOT.

        A long record with any multi-token chunk (every record whose counts were scaled to
        the engine's usage) is spread with numpy — the same IEEE operations (``g / k`` in
        float64), so the same values as the per-chunk loop: 1.2 ms, not 7.8, at 16k chunks."""
        offs, toks = self.chunk_offsets_s, self.chunk_tokens
        if len(offs) < 2:
            return []
        ks = toks[1:len(offs)]
        if ks.count(1) == len(ks):  # one token a chunk (a missing count is 1): the gaps
            return list(map(operator.sub, offs[1:], offs))
        if len(offs) > _ITL_LOOP_MAX:
            return _itl_spread(offs, toks)
        out: list[float] = []
        anchor = offs[0]
        for i in range(1, len(offs)):
            k = toks[i] if i < len(toks) else 1
            if k <= 0:
                continue
            t = offs[i]
            g = t - anchor
            anchor = t
            out.extend([g / k] * k)
        return out

    def tpot_s(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1), only when output tokens > 1 and the response
        was streamed: a non-streaming answer arrives whole (its TTFT is its E2E), so it says
        nothing about the pace of its tokens — 0 s went into the TPOT percentiles and met
        every TPOT SLO."""
        n = self.completion_tokens
        if self.ttft_s is None or n is None or n <= 1 or not self.stream:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def tps(self) -> float | None:
        """Per-request output tokens/s: (output tokens − 1) / (E2E − TTFT); streamed
        responses only (see :meth:`tpot_s`)."""
        n = self.completion_tokens
        if self.ttft_s is None or n is None or n <= 1 or not self.stream:
            return None
        dt = self.e2e_s - self.ttft_s
        return (n - 1) / dt if dt > 0 else None

    # -- (de)serialisation -----------------------------------------------------------------

    def to_json_dict(self) -> dict[str, Any]:
        """The recording's ``request`` line as a dict (``type`` first, then the fields in
        order; the chunk lists as lists). Built field by field: ``dataclasses.asdict``
        deep-copied every chunk offset — 33–82 ms for a 16k-token answer, so 100 recent
        long answers held the admin API's loop for seconds."""
        d: dict[str, Any] = {"type": "request"}
        for n in _RECORD_FIELDS:
            d[n] = getattr(self, n)
        d["dialect"] = outside_dialect(self.dialect)
        d["chunk_offsets_s"] = list(self.chunk_offsets_s)
        d["chunk_tokens"] = list(self.chunk_tokens)
        return d

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> RequestRecord:
        kw: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        kw["chunk_offsets_s"] = tuple(float(x) for x in d.get("chunk_offsets_s") or ())
        kw["chunk_tokens"] = tuple(int(x) for x in d.get("chunk_tokens") or ())
        kw["concurrency_at_start"] = int(d.get("concurrency_at_start") or 0)
        return cls(**kw)


class PromptCount(Protocol):
    """Where an open request's prompt size (Anthropic's ``message_start``, OpenAI's
    continuous usage, ...) and the engine's id of it appear while it streams (the proxy's
    dialect parser)."""

    @property
    def usage_prompt_tokens(self) -> int | None: ...

    @property
    def response_id(self) -> str | None:
        """The engine's id of the answer, once its body has named it."""
        ...


LOCAL: Final = {"wire": False}
"""Metadata of an :class:`ActiveRequest` field that only the process serving the request
has (not shipped to the coordinator of ``--workers N``: :mod:`llmtop.workers_wire`)."""


@dataclass(slots=True)
class ActiveRequest:
    """A request the proxy has open. Mutated only by the proxy's relay; read by snapshots.

    ``t0_ns`` and ``first_token_ns`` are ``time.perf_counter_ns()`` readings; ``t_start`` is
    the matching wall-clock anchor (unix seconds) taken once per request.

    Nothing here is written per chunk but the chunk counters: ``status`` is set once, when
    the response head has gone to the client, and the prompt's size is read from the
    stream's parser (``usage``) when a row is built (:attr:`prompt_so_far`), not copied as
    each read is parsed.
    """

    id: str
    user: str
    model: str | None
    dialect: Dialect
    path: str
    stream: bool
    t_start: float
    t0_ns: int
    concurrency_at_start: int = 0
    first_token_ns: int | None = None
    last_chunk_ns: int | None = None
    chunks: int = 0
    tokens: int = 0
    status: int | None = None
    """The HTTP status sent to the client, once the response head has gone out."""
    prompt_tokens: int | None = None
    """The prompt's size when it came with the request's row (a worker's report to the
    coordinator of ``--workers N``); the process serving the request reads its ``usage``."""
    upstream_id: str | None = None
    """The engine's id of the request as far as known: the response's ``X-Request-Id``,
    set once with the response head, or a worker's report; the process serving the
    request reads the body's id from its ``usage`` (:attr:`upstream_id_so_far`)."""
    usage: PromptCount | None = field(default=None, repr=False, compare=False,
                                      metadata=LOCAL)
    """The stream's parser, in the process serving the request (last: the fields before it
    are the wire's, in order)."""

    @property
    def prompt_so_far(self) -> int | None:
        """The prompt's size as far as the stream has said (None: not yet)."""
        usage = self.usage
        if usage is not None:
            n = usage.usage_prompt_tokens
            if n is not None:
                return n
        return self.prompt_tokens

    @property
    def upstream_id_so_far(self) -> str | None:
        """The engine's id of the request as far as it has said (None: not yet): its
        ``X-Request-Id``, else the id its stream has named."""
        uid = self.upstream_id
        if uid is None:
            usage = self.usage
            if usage is not None:
                return usage.response_id
        return uid

    @property
    def state(self) -> Literal["waiting", "streaming"]:
        return "waiting" if self.first_token_ns is None else "streaming"

    def lost(self, now_ns: int, error: str) -> RequestRecord:
        """The record of this request when the process serving it died with it open: what
        is known of it (start, first token, tokens so far), outcome ``error`` — the client
        saw its stream cut after the head it had (its ``status``; without one, 200 once a
        first token had come), or no answer (status 502 then)."""
        started = self.first_token_ns is not None
        status = self.status if self.status is not None else 200 if started else 502
        return RequestRecord(
            id=self.id, user=self.user, model=self.model, dialect=self.dialect,
            path=self.path, stream=self.stream, status=status,
            outcome="error", t_start=self.t_start,
            ttft_s=None if self.first_token_ns is None
            else (self.first_token_ns - self.t0_ns) / 1e9,
            e2e_s=max(0.0, (now_ns - self.t0_ns) / 1e9), prompt_tokens=self.prompt_so_far,
            completion_tokens=self.tokens, token_source="chunks",
            concurrency_at_start=self.concurrency_at_start, error=error,
            upstream_id=self.upstream_id_so_far)

    def to_json_dict(self, now_ns: int) -> dict[str, Any]:
        """The ``request`` shape with fields so far (for ``/llmtop/v1/requests?state=active``):
        every scalar field of a record, ``null`` where not known yet (``outcome``,
        ``e2e_s`` and ``error`` always; ``status`` until the response head has gone to the
        client; ``prompt_tokens`` until the stream has given the prompt's size, which
        Anthropic's ``message_start`` and OpenAI's continuous usage do early, others only
        at the end; ``upstream_id`` until the response head or the body has named it);
        ``completion_tokens`` counted from the stream so far
        (``token_source`` ``chunks``); and, beyond the record,
        ``state`` (waiting/streaming), ``age_s``, ``chunks`` (how many so far, instead of
        the per-chunk lists) and ``tps``.

        ``tps`` is (tokens so far − 1) / (now − first token): the rate up to *now*, not to
        the last chunk, so a stream that stalls shows a falling rate (measured to its last
        chunk, a 40 tok/s stream read 40 tok/s through a 20 s stall); ``None`` before a
        second token."""
        # the relay (another thread) writes these while a row is built: each is read once,
        # so that one row never says both "waiting" and a TTFT, or counts tokens twice
        ft, tokens, chunks = self.first_token_ns, self.tokens, self.chunks
        # (after them: the parser has the prompt's size before the relay counts the chunk
        # that gave it, so a row counting that chunk has it too)
        prompt = self.prompt_so_far
        age = (now_ns - self.t0_ns) / 1e9
        ttft = None if ft is None else (ft - self.t0_ns) / 1e9
        tps = None
        if ft is not None and tokens > 1:
            # a chunk may have been written after ``now_ns`` was read
            end = max(now_ns, self.last_chunk_ns or 0)
            dt = (end - ft) / 1e9
            tps = (tokens - 1) / dt if dt > 0 else None
        return {
            "type": "request",
            "id": self.id,
            "user": self.user,
            "model": self.model,
            "dialect": outside_dialect(self.dialect),
            "path": self.path,
            "stream": self.stream,
            "status": self.status,
            "outcome": None,
            "state": "waiting" if ft is None else "streaming",
            "t_start": self.t_start,
            "age_s": age,
            "ttft_s": ttft,
            "e2e_s": None,
            "prompt_tokens": prompt,
            "chunks": chunks,
            "completion_tokens": tokens,
            "token_source": "chunks",
            "tps": tps,
            "concurrency_at_start": self.concurrency_at_start,
            "error": None,
            "upstream_id": self.upstream_id_so_far,
        }


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU sample. Unavailable readings are ``None`` (render as "n/a").

    ``util_gpu``: % of time a kernel ran (nvidia-smi utilization.gpu).
    ``mem_busy``: % of time device memory was read or written (utilization.memory) — busy
    time, **not** bandwidth. ``dram_bw_util``: GPM DRAM bandwidth, % of theoretical peak.
    """

    t: float
    index: int
    name: str
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    util_gpu: float | None = None
    mem_busy: float | None = None
    dram_bw_util: float | None = None
    power_w: float | None = None
    simulated: bool = False
    sm_activity: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    pcie_rx_bytes_s: float | None = None
    pcie_tx_bytes_s: float | None = None

    def to_json_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "gpu"}
        for n in _GPU_FIELDS:
            d[n] = getattr(self, n)
        return d

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> GpuReading:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One scrape of the upstream engine's Prometheus ``/metrics``.

    ``kind``: vllm, sglang, tgi, llamacpp, sim (llmtop's simulator, vLLM names) or unknown.
    ``kv_cache_usage`` is a 0–1 fraction. ``ttft_buckets`` is the engine's own TTFT
    histogram as cumulative (upper bound seconds, count) pairs, when it exports one.
    """

    t: float
    kind: str
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    preemptions: float | None = None
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    raw: dict[str, float] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "engine"}
        for n in _ENGINE_FIELDS:
            d[n] = getattr(self, n)
        # JSON has no infinity: the +Inf bucket bound is written as Prometheus spells it
        d["ttft_buckets"] = [["+Inf" if math.isinf(le) else le, n] for le, n in self.ttft_buckets]
        d["raw"] = dict(self.raw)
        return d

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> EngineReading:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["ttft_buckets"] = tuple(
            (float(a), float(b)) for a, b in d.get("ttft_buckets") or ()
        )
        kw["raw"] = dict(d.get("raw") or {})
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class WarningEvent:
    """A saturation warning raised or cleared (the recording's ``warning`` line)."""

    t: float
    code: str
    severity: Severity
    message: str
    state: WarningState
    since: float | None = None
    """A warning still raised when a rotated recording's new part began is written again
    at the part's start (``t``), with ``since`` the time it was first raised (None
    otherwise; the line then has no ``since``)."""

    def to_json_dict(self) -> dict[str, Any]:
        d = {"type": "warning", "t": self.t, "code": self.code, "severity": self.severity,
             "message": self.message, "state": self.state}
        if self.since is not None:
            d["since"] = self.since
        return d

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> WarningEvent:
        since = d.get("since")
        return cls(
            t=float(d["t"]),
            code=str(d["code"]),
            severity=d.get("severity", "warning"),
            message=str(d.get("message", "")),
            state=d.get("state", "raised"),
            since=None if since is None else float(since),
        )


@dataclass(frozen=True, slots=True)
class ChunkSlice:
    """The latest content chunks of a stream that is still open, published by the relay
    every so often (see ``llmtop.proxy.relay.Exchange.hold``) so the metrics can file its
    ITL and chunk-gap samples as they happen rather than when the request ends. The stream's
    :class:`RequestRecord` still carries every chunk (the aggregator files only those no
    slice did). Never written to a recording: the record holds the same chunks.

    ``offsets_ns`` are the chunks' ``time.perf_counter_ns()`` write times (the clock of the
    proxy process that served the stream; ``t0_ns`` is the request's t0 on it), ``tokens``
    the parser's own count of each (not yet scaled to the engine's usage); ``first`` is the
    index of the slice's first chunk in the stream (the slices of a stream follow each other
    without gap or overlap), ``prev_ns`` the time of the chunk before it (``None`` for the
    first slice), so the slice's first gap is known. ``t`` is the unix time of its last
    chunk.
    """

    id: str
    user: str
    model: str | None
    t: float
    t0_ns: int
    first: int
    prev_ns: int | None
    offsets_ns: tuple[int, ...]
    tokens: tuple[int, ...]

    def to_json_dict(self) -> dict[str, Any]:
        """The event as a dict (``type`` ``chunks``): how it crosses from a ``--workers``
        process to the coordinator (:mod:`llmtop.workers_wire`); tuples stay tuples."""
        d: dict[str, Any] = {"type": "chunks"}
        for n in _SLICE_FIELDS:
            d[n] = getattr(self, n)
        return d

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> ChunkSlice:
        """The event from :meth:`to_json_dict`'s dict, every field checked (``TypeError`` or
        ``ValueError`` for anything else: it comes from another process)."""
        offs, toks = d["offsets_ns"], d["tokens"]
        if (type(d["id"]) is not str or type(d["user"]) is not str
                or not (d["model"] is None or type(d["model"]) is str)
                or type(d["t"]) not in (float, int) or type(d["t0_ns"]) is not int
                or type(d["first"]) is not int or d["first"] < 0
                or not (d["prev_ns"] is None or type(d["prev_ns"]) is int)
                or type(offs) not in (tuple, list) or type(toks) not in (tuple, list)
                or len(offs) != len(toks)
                or not all(map(isinstance, offs, repeat(int)))
                or not all(map(isinstance, toks, repeat(int)))):
            raise ValueError("malformed chunk slice")
        return cls(id=d["id"], user=d["user"], model=d["model"], t=float(d["t"]),
                   t0_ns=d["t0_ns"], first=d["first"], prev_ns=d["prev_ns"],
                   offsets_ns=tuple(offs), tokens=tuple(toks))


Event: TypeAlias = RequestRecord | GpuReading | EngineReading | WarningEvent | ChunkSlice

# The events' fields in order, for their ``to_json_dict`` (every field is an immutable
# scalar or a tuple of them, except EngineReading.raw, copied there): ``dataclasses.asdict``
# deep-copies each value, which for a request's chunk tuples is the whole cost.
_RECORD_FIELDS: Final = tuple(f.name for f in fields(RequestRecord))
_GPU_FIELDS: Final = tuple(f.name for f in fields(GpuReading))
_ENGINE_FIELDS: Final = tuple(f.name for f in fields(EngineReading))
_SLICE_FIELDS: Final = tuple(f.name for f in fields(ChunkSlice))

_ITL_LOOP_MAX: Final = 64
"""Up to this many chunks the ITL spread is a plain loop (numpy's call overhead is more)."""


def itl_anchors(toks: npt.NDArray[np.int64], first: npt.NDArray[np.bool_]
                ) -> npt.NDArray[np.int64] | None:
    """The ITL anchor of every point of flat chunk arrays (several records' chunks one after
    another; ``first[i]``: point i is its record's first): for point i ≥ 1 (the result is
    aligned with ``offs[1:]``), the index of the latest point before it in its record that
    carried tokens (``toks > 0``) or is the record's first — point i's ITL gap is
    ``offs[i] - offs[anchor]`` (:meth:`RequestRecord.itl_samples_s`). The value at a
    record's first point is meaningless (it has no gap: callers drop it). ``None`` when
    every anchor is the point just before (no 0-token chunk inside a record): the ITL gaps
    are then the chunk gaps."""
    n = len(toks)
    if n < 2:
        return None
    mark = toks[:-1] > 0
    mark |= first[:-1]
    if mark.all():
        return None
    idx = np.arange(n - 1, dtype=np.int64)
    idx[~mark] = 0  # a record's first point is marked, so no anchor crosses records
    np.maximum.accumulate(idx, out=idx)
    return idx


def _itl_spread(offs: tuple[float, ...], toks: tuple[int, ...]) -> list[float]:
    """:meth:`RequestRecord.itl_samples_s` for a long record, the same values: the gaps
    from each chunk's anchor (``offs[i] - offs[a]``, a the previous chunk that carried
    tokens, or chunk 0: :func:`itl_anchors`; the chunk gaps when no chunk after the first
    carries 0), each chunk's split into k samples of ``gap / k`` (Python's float / int, or
    numpy's float64 / int64: the same IEEE division); a count past the end of ``toks`` is
    1, a count <= 0 gives no sample.

    Usually only a few chunks carry other than one token (the last one, rescaled for the
    stop token): the gaps list is then spliced around them. Otherwise numpy repeats."""
    n = len(offs)
    m = min(len(toks), n)
    ka = np.asarray(toks[1:m], dtype=np.int64)
    odd = np.flatnonzero(ka != 1).tolist()
    anchors: npt.NDArray[np.int64] | None = None
    if odd and int(ka.min()) <= 0:
        ks_all = np.ones(n, dtype=np.int64)
        ks_all[1:m] = ka
        first = np.zeros(n, dtype=bool)
        first[0] = True
        anchors = itl_anchors(ks_all, first)
    if len(odd) <= n // 16:
        if anchors is None:
            gaps = list(map(operator.sub, offs[1:], offs))
        else:
            oa = np.asarray(offs, dtype=np.float64)
            gaps = (oa[1:] - oa[anchors]).tolist()
        out: list[float] = []
        prev = 0
        for j in odd:
            out += gaps[prev:j]
            k = toks[j + 1]
            if k > 0:
                out += [gaps[j] / k] * k
            prev = j + 1
        out += gaps[prev:]
        return out
    ks = np.ones(n - 1, dtype=np.int64)
    if m > 1:
        ks[:m - 1] = ka
    oa = np.asarray(offs, dtype=np.float64)
    g = oa[1:] - (oa[:-1] if anchors is None else oa[anchors])
    keep = ks > 0
    if not keep.all():
        g, ks = g[keep], ks[keep]
    spread: list[float] = np.repeat(g / ks, ks).tolist()
    return spread


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN/inf: map them to None."""
    if x is None or not math.isfinite(x):
        return None
    return x
