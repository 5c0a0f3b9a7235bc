"""Recognising an inference engine by its Prometheus metric names, and reading its state.

:func:`recognise` parses exposition text (:mod:`llmtop.engines.exposition`) and fills an
:class:`~llmtop.events.EngineReading`:

- vllm: running ``vllm:num_requests_running``, waiting ``vllm:num_requests_waiting``,
  KV ``vllm:kv_cache_usage_perc`` (older ``vllm:gpu_cache_usage_perc``; a 0–1 fraction
  despite the name).
- sglang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``.
- tgi: running ``tgi_batch_current_size``, waiting ``tgi_queue_size``; no KV reading.
- llamacpp: ``llamacpp:requests_processing``, ``llamacpp:requests_deferred``,
  ``llamacpp:kv_cache_usage_ratio`` (absent from current llama-server builds → None).
- sim: llmtop's simulator — vLLM names plus a metric starting ``llmtop_sim``.
- unknown: none of these; only ``raw`` is filled.

Preemptions: ``vllm:num_preemptions_total``. The engine's own TTFT histogram:
``vllm:time_to_first_token_seconds`` / ``sglang:time_to_first_token_seconds``.

Several label sets (one per ``model_name``, engine or data-parallel rank) are **summed** for
counts (running, waiting, preemptions, histogram buckets) and reduced with **max** for the
KV-cache fraction — the fullest cache is the one about to preempt, which is what a warning
must catch. Series that differ only in SGLang's ``tp_rank``/``pp_rank`` are copies of one
figure and count once (:data:`REPLICA_LABELS`). ``raw`` keeps up to :data:`RAW_LIMIT`
finite samples (``_bucket`` and ``_created`` samples, and keys over :data:`RAW_KEY_LIMIT`
characters, left out; the engine's own names first) keyed ``name{label="value",...}``
(values escaped), for every kind.

Sample names are kept as written: a ``counter`` without ``_total`` (the real llama.cpp
capture has ``llamacpp:n_tokens_max`` as one) stays without it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from llmtop.engines.exposition import iter_samples
from llmtop.events import EngineReading

RAW_LIMIT = 200
"""Most raw samples kept per reading (the recording stores them every scrape)."""
RAW_KEY_LIMIT = 4096
"""Longest raw key kept: a sample with a longer one (a label value of megabytes) is left
out of ``raw``, which the recording stores every scrape."""


@dataclass(frozen=True, slots=True)
class EngineNames:
    """The metric names that give one engine's readings."""

    kind: str
    prefix: str
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_cache: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    ttft_histogram: tuple[str, ...] = ()


VLLM = EngineNames(
    kind="vllm",
    prefix="vllm:",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions=("vllm:num_preemptions_total", "vllm:num_preemptions"),
    ttft_histogram=("vllm:time_to_first_token_seconds",),
)
SGLANG = EngineNames(
    kind="sglang",
    prefix="sglang:",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_cache=("sglang:token_usage",),
    ttft_histogram=("sglang:time_to_first_token_seconds",),
)
TGI = EngineNames(
    kind="tgi",
    prefix="tgi_",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
)
LLAMACPP = EngineNames(
    kind="llamacpp",
    prefix="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    kv_cache=("llamacpp:kv_cache_usage_ratio",),
)
ENGINES = (VLLM, SGLANG, TGI, LLAMACPP)
TTFT_HISTOGRAMS = frozenset(n for e in ENGINES for n in e.ttft_histogram)
"""The only histograms whose buckets are read; other ``_bucket`` lines are skipped."""
REPLICA_LABELS = frozenset({"tp_rank", "pp_rank"})
"""Labels that tell copies of one scheduler's figures apart: SGLang's tensor-parallel ranks
of one data-parallel group (``dp_rank``) and its pipeline stages all hold the same batch,
and each exports it (every TP rank with ``--enable-metrics-for-all-schedulers``, every
stage by default). Summed, 4 TP ranks running 8 requests read 32."""
SIM_MARKER = "llmtop_sim"
"""A metric name prefix only llmtop's simulator exports (it otherwise speaks vLLM)."""


class Samples:
    """Parsed exposition: sample name → [(labels, value)], in text order."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.order: list[tuple[str, dict[str, str], float]] = []

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self.by_name.setdefault(name, []).append((labels, value))
        self.order.append((name, labels, value))

    def values(self, names: Iterable[str]) -> list[float] | None:
        """Finite values of the first of ``names`` that is present (None if none is), one
        per series once copies are merged: series that differ only in a
        :data:`REPLICA_LABELS` label are one figure (their largest)."""
        for n in names:
            if n in self.by_name:
                rows = self.by_name[n]
                if not any(REPLICA_LABELS.intersection(labels) for labels, _ in rows):
                    return [v for _, v in rows if math.isfinite(v)]
                merged: dict[tuple[tuple[str, str], ...], float] = {}
                for labels, v in rows:
                    if math.isfinite(v):
                        key = tuple(sorted((k, x) for k, x in labels.items()
                                           if k not in REPLICA_LABELS))
                        merged[key] = max(v, merged.get(key, v))
                return list(merged.values())
        return None


def parse_samples(text: str, keep_buckets: Collection[str] | None = None) -> Samples:
    """The samples in the exposition ``text`` — all of them, or with only the histogram
    buckets of ``keep_buckets`` (base names: bucket lines are most of a vLLM exposition and
    nobody reads the others); raises ValueError if it does not parse."""
    out = Samples()
    for name, labels, value in iter_samples(text, keep_buckets):
        out.add(name, labels, value)
    return out


def detect_kind(samples: Samples) -> str:
    """vllm, sglang, tgi, llamacpp, sim or unknown — the engine whose prefix has the most
    samples (a proxy in front may add a few foreign ones)."""
    names = samples.by_name
    if any(n.startswith(SIM_MARKER) for n in names):
        return "sim"
    best, best_n = "unknown", 0
    for eng in ENGINES:
        n = sum(1 for name in names if name.startswith(eng.prefix))
        if n > best_n:
            best, best_n = eng.kind, n
    return best


def _sum(values: list[float] | None) -> float | None:
    return None if not values else math.fsum(values)


def _max(values: list[float] | None) -> float | None:
    return None if not values else max(values)


def histogram_buckets(samples: Samples, names: Iterable[str]) -> tuple[tuple[float, float], ...]:
    """Cumulative (upper bound, count) pairs of the first histogram of ``names`` present,
    summed over label sets, sorted by bound (``+Inf`` included as ``math.inf``).

    A series (one label set) without its ``+Inf`` bucket takes that count from its
    ``_count`` sample (Prometheus defines them equal); one with neither is left out: its
    finite buckets alone would pass the observations below the last bound for all of
    them, and a quantile read off them would be made up."""
    for base in names:
        rows = samples.by_name.get(base + "_bucket")
        if not rows:
            continue
        series: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        for labels, value in rows:
            try:
                le = float(labels["le"])
            except (KeyError, ValueError):
                continue
            if math.isfinite(value):
                key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                series.setdefault(key, {})[le] = value
        counts = {tuple(sorted(labels.items())): value
                  for labels, value in samples.by_name.get(base + "_count", ())
                  if math.isfinite(value)}
        acc: dict[float, float] = {}
        for key, bounds in series.items():
            if math.inf not in bounds:
                if key not in counts:
                    continue
                bounds[math.inf] = counts[key]
            for le, value in bounds.items():
                acc[le] = acc.get(le, 0.0) + value
        return tuple(sorted(acc.items()))
    return ()


def _escape(value: str) -> str:
    """A label value as exposition text writes it (backslash, quote and newline escaped)."""
    if "\\" not in value and '"' not in value and "\n" not in value:
        return value
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _raw_key(name: str, labels: dict[str, str]) -> str:
    """``name{label="value",...}``, labels sorted, values escaped: exposition syntax that
    reads back to the same labels (unescaped, ``a="x\\",b=\\"y"`` and ``a="x",b="y"``
    made one key)."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def raw_values(samples: Samples, limit: int = RAW_LIMIT, prefer: str = "") -> dict[str, float]:
    """Up to ``limit`` finite samples, histogram buckets, ``_created`` and keys longer than
    :data:`RAW_KEY_LIMIT` left out; names starting with ``prefer`` (the engine's own
    prefix) come first, the rest in text order."""
    raw: dict[str, float] = {}
    for own in (True, False) if prefer else (False,):
        for name, labels, value in samples.order:
            if len(raw) >= limit:
                return raw
            if prefer and name.startswith(prefer) != own:
                continue
            if name.endswith(("_bucket", "_created")) or not math.isfinite(value):
                continue
            key = _raw_key(name, labels)
            if len(key) <= RAW_KEY_LIMIT:
                raw[key] = value
    return raw


def reading_from_samples(samples: Samples, t: float) -> EngineReading:
    """The :class:`EngineReading` for already-parsed samples (see :func:`recognise`)."""
    kind = detect_kind(samples)
    names = VLLM if kind == "sim" else next((e for e in ENGINES if e.kind == kind), None)
    raw = raw_values(samples, prefer=names.prefix if names else "")
    if names is None:
        return EngineReading(t=t, kind=kind, raw=raw)
    return EngineReading(
        t=t,
        kind=kind,
        running=_sum(samples.values(names.running)),
        waiting=_sum(samples.values(names.waiting)),
        kv_cache_usage=_max(samples.values(names.kv_cache)),
        preemptions=_sum(samples.values(names.preemptions)),
        ttft_buckets=histogram_buckets(samples, names.ttft_histogram),
        raw=raw,
    )


def recognise(text: str, t: float) -> EngineReading:
    """Parse Prometheus exposition ``text`` scraped at ``t`` into an :class:`EngineReading`.

    Raises ValueError when the text is not Prometheus exposition at all.
    """
    return reading_from_samples(parse_samples(text, TTFT_HISTOGRAMS), t)
