"""Service-level objectives: per-request pass/fail, attainment and goodput.

A finished request **meets the SLOs** when its outcome is ``ok`` and every configured
objective holds (``≤``, any subset may be configured):

- ``ttft_s``: TTFT ≤ the limit. A request that never produced a first token fails it.
- ``itl_p95_s``: the request's own P95 inter-token latency ≤ the limit. The P95 is taken
  over the request's ITL samples (a chunk of k > 0 tokens gives k samples of g/k, g its
  time since the previous chunk that carried tokens, or since the first chunk) by the HDR
  rule on exact values: the ``max(int(0.95·n + 0.5), 1)``-th smallest sample. A request
  with no ITL sample (fewer than two content chunks, or none after the first that carries
  tokens) has nothing that can violate it and passes.
- ``tpot_s``: TPOT ≤ the limit, when TPOT is defined (more than one output token);
  otherwise it passes.
- ``e2e_s``: E2E ≤ the limit.

With no objective configured a request meets the SLOs exactly when its outcome is ok.

A **non-streamed** response (the record's ``stream`` false) arrives whole: its TTFT is its
E2E, it has no inter-token gaps and no TPOT. TTFT, ITL and TPOT are not applicable to it
(as TPOT is not to a one-token answer): it is judged on E2E and its outcome only, and a
non-streamed request cancelled before its answer is not judged on TTFT either.

A request is **judged** (counted in attainment's denominator) unless its client cancelled
it while it was still within every objective: then nothing the server did failed it (a
load generator ending a level, a user pressing stop on a fast answer). A cancelled request
that had already broken one — its TTFT over the limit, or no first token yet after the
limit; its ITL P95 so far; its E2E so far — is judged and fails: the user gave up on a
slow server. (A cancelled request's partial TPOT includes the wait before the cancel, so
it is not judged on TPOT.) Errors and timeouts are always judged, and fail.

*Attainment* is met ÷ judged requests in the window (``None`` with none); *goodput* is
met requests per second and their output tokens per second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from llmtop.config import Config, SloConfig
from llmtop.events import RequestRecord

FLOAT_SLACK_S: Final = 1e-9
"""A figure within a nanosecond of its objective meets it. ITL and TPOT are differences
(and quotients) of float seconds: chunks written exactly 50,000,000 ns apart, 0.09 s and
0.14 s into a request, are 0.05000000000000002 s apart, which missed a 0.05 s objective."""

ITL_PERCENTILE = 95.0


@dataclass(frozen=True, slots=True)
class Slo:
    """The configured objectives (``None`` = not configured) and the attainment target."""

    ttft_s: float | None = None
    itl_p95_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    target: float = 0.95

    @staticmethod
    def from_config(cfg: Config | SloConfig) -> Slo:
        s = cfg.slo if isinstance(cfg, Config) else cfg
        return Slo(s.ttft_s, s.itl_p95_s, s.tpot_s, s.e2e_s, s.target)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Slo:
        def num(k: str) -> float | None:
            v = d.get(k)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        target = num("target")
        return Slo(num("ttft_s"), num("itl_p95_s"), num("tpot_s"), num("e2e_s"),
                   0.95 if target is None else target)

    def as_dict(self) -> dict[str, float]:
        """The configured objectives and the target (unset ones left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def rank_of_percentile(n: int, p: float = ITL_PERCENTILE) -> int:
    """1-based rank of percentile ``p`` among ``n`` samples (hdrh's target-count rule)."""
    return max(int(p * n / 100 + 0.5), 1)


def request_itl_p95(r: RequestRecord) -> float | None:
    """The request's own P95 ITL (seconds), ``None`` without ITL samples (a non-streamed
    response has none: its body's timing is not a pace of tokens).

    The P95 of :meth:`RequestRecord.itl_samples_s`, found without spreading them: a chunk
    of k > 0 tokens, g after the previous chunk that carried tokens (or chunk 0), is k
    samples of g / k, weighed here as one value of weight k (a 0-token chunk none, and it
    takes no time from the next). Spread, an engine's usage of 10**15 tokens (a counter
    bug) asked for a list of 10**15 floats (MemoryError), and 30 M tokens took a second per
    request."""
    if not r.stream:
        return None
    offs, toks = r.chunk_offsets_s, r.chunk_tokens
    weighed: list[tuple[float, int]] = []
    anchor = offs[0] if offs else 0.0
    for i in range(1, len(offs)):
        k = toks[i] if i < len(toks) else 1
        if k > 0:
            t = offs[i]
            weighed.append(((t - anchor) / k, k))
            anchor = t
    if not weighed:
        return None
    weighed.sort()
    rank = rank_of_percentile(sum(k for _, k in weighed))
    seen = 0
    for value, k in weighed:
        seen += k
        if seen >= rank:
            return value
    return weighed[-1][0]


def meets_slo(r: RequestRecord, slo: Slo, itl_p95: float | None = None,
              *, itl_known: bool = False) -> bool:
    """Whether one request meets every configured objective (see the module docstring).

    ``itl_p95`` may be passed when already computed (``itl_known=True``).
    """
    if r.outcome != "ok":
        return False
    if slo.ttft_s is not None and r.stream and (r.ttft_s is None or r.ttft_s > slo.ttft_s):
        return False
    if slo.e2e_s is not None and r.e2e_s > slo.e2e_s:
        return False
    if slo.tpot_s is not None:
        tpot = r.tpot_s()
        if tpot is not None and tpot > slo.tpot_s + FLOAT_SLACK_S:
            return False
    if slo.itl_p95_s is not None:
        p95 = itl_p95 if itl_known else request_itl_p95(r)
        if p95 is not None and p95 > slo.itl_p95_s + FLOAT_SLACK_S:
            return False
    return True


def slo_judged(r: RequestRecord, slo: Slo) -> bool:
    """Whether a finished request counts in attainment (see the module docstring)."""
    if r.outcome != "cancelled":
        return True
    if slo.ttft_s is not None and r.stream:
        waited = r.e2e_s if r.ttft_s is None else r.ttft_s
        if waited > slo.ttft_s:
            return True
    if slo.e2e_s is not None and r.e2e_s > slo.e2e_s:
        return True
    if slo.itl_p95_s is not None:
        p95 = request_itl_p95(r)
        if p95 is not None and p95 > slo.itl_p95_s + FLOAT_SLACK_S:
            return True
    return False


def grouped_itl_p95(
    rec: npt.NDArray[np.int64],
    itl: npt.NDArray[np.float64],
    weight: npt.NDArray[np.int64],
    n_records: int,
) -> npt.NDArray[np.float64]:
    """Per-record P95 of weighted ITL samples, vectorised over a batch.

    ``rec[i]`` is the record a sample value belongs to, ``itl[i]`` its value and
    ``weight[i]`` how many samples it stands for. Returns NaN for records without samples.
    Same rule as :func:`request_itl_p95`.
    """
    out = np.full(n_records, np.nan)
    keep = weight > 0
    if not keep.any():
        return out
    rec, itl, weight = rec[keep], itl[keep], weight[keep]
    order = np.lexsort((itl, rec))
    rec, itl, weight = rec[order], itl[order], weight[order]
    cum = np.cumsum(weight)
    starts = np.flatnonzero(np.diff(rec, prepend=np.int64(-1)) != 0)
    ends = np.append(starts[1:], len(rec))
    before = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0)
    n = cum[ends - 1] - before
    target = np.maximum(np.floor(ITL_PERCENTILE * n.astype(np.float64) / 100 + 0.5), 1)
    pos = np.searchsorted(cum, before + target.astype(np.int64), side="left")
    out[rec[starts]] = itl[np.minimum(pos, ends - 1)]
    return out


def grouped_itl_within(
    rec: npt.NDArray[np.int64],
    itl: npt.NDArray[np.float64],
    weight: npt.NDArray[np.int64],
    n_records: int,
    limit: float,
) -> npt.NDArray[np.bool_]:
    """Per record: whether its P95 ITL (:func:`grouped_itl_p95`) is ≤ ``limit`` or it has
    none — by counting, without sorting: the P95 is the ``rank(n)``-th smallest of the
    ``n`` samples, so it is ≤ ``limit`` exactly when at least ``rank(n)`` samples are (a NaN
    value sorts last there, and a NaN P95 passes)."""
    w = np.where(weight > 0, weight, 0).astype(np.float64)
    n = np.bincount(rec, weights=w, minlength=n_records)
    le = np.bincount(rec, weights=np.where(itl <= limit + FLOAT_SLACK_S, w, 0.0),
                     minlength=n_records)
    rank = np.maximum(np.floor(ITL_PERCENTILE * n / 100 + 0.5), 1)
    ok: npt.NDArray[np.bool_] = (n == 0) | (le >= rank)
    nan = np.isnan(itl)
    if nan.any():
        known = np.bincount(rec, weights=np.where(nan, 0.0, w), minlength=n_records)
        ok |= known < rank
    return ok
