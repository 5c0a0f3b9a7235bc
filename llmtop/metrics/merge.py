"""Exact merging of snapshots from several proxies (``llmtop attach URL1 URL2 ...``).

- Latency: the encoded histograms are decoded, added bucket by bucket and the
  percentiles recomputed from the sum — exact, never an average of percentiles.
- Counts and rates are summed: each proxy divides by its own window span, so a proxy
  started 3 s ago (span 3 s) and one running for an hour (span 10–12 s) add up right; the
  merged ``span_s`` is the largest part's, and summed counts divided by it are not the
  rates when the parts' spans differ. Attainment is recomputed from the summed
  ``slo_met`` and ``slo_judged`` (from a proxy that sends only the interface's
  ``slo_attainment`` and ``requests``: their product and ``requests``).
- Users and models are merged by name — the fold of those past each proxy's top N
  (``tracked`` false, named ``other``) only with other folds, never with a real user
  named ``other``. Their percentiles are exact when every part
  carries its histograms (``?user_histograms=1`` on the snapshot); otherwise the largest
  part's value is kept as an upper bound and the row is marked ``"approximate": true``.
- GPUs are de-duplicated by (host, index), keeping the freshest reading; engines by
  upstream (proxies in front of one engine see the same engine once; distinct engines
  are summed).
- Capacity bins are summed per concurrency and the estimate recomputed (concurrency is
  per proxy: each proxy's own in-flight count when the request started).
- Warnings: union by code, the earliest ``since`` and the most severe level; and
  ``MIXED_SLO`` when the proxies' SLOs differ (their attainment and goodput are each
  judged by their own objectives: summed, they are no one SLO's figures, and the ``slo``
  shown is the first's).
- ``series`` points (aligned to the same 2 s grid everywhere) are summed; their P95s are
  the largest part's (an upper bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from llmtop.metrics import capacity
from llmtop.metrics.hdr import compact, decode_sparse, encode_sparse, summary_seconds
from llmtop.metrics.slo import Slo

METRIC_NAMES: Final = ("ttft", "itl", "chunk_gap", "tpot", "e2e")
_SEVERITY: Final = {"info": 0, "warning": 1, "critical": 2}
_ROW_SUM_KEYS: Final = (
    "requests", "rps", "output_tps", "input_tps", "errors", "cancelled", "timeouts",
    "slo_met", "goodput_rps", "goodput_tps", "finished_output_tps", "output_tokens",
    "in_flight", "waiting", "streaming", "ok", "input_tokens",
)
_SERIES_SUM: Final = ("rps", "output_tps", "input_tps", "goodput_tps", "errors", "requests",
                      "slo_met", "in_flight", "waiting", "streaming")


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return x


def _sum(values: Iterable[object]) -> int | float | None:
    nums = [v for v in (_num(x) for x in values) if v is not None]
    if not nums:
        return None
    return sum(nums)


def _mapping(x: object) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _judged(row: Mapping[str, Any]) -> int:
    """The requests a row's attainment is over: ``slo_judged``, or ``requests`` from an
    llmtop that did not send it."""
    v = _num(row.get("slo_judged"))
    if v is None:
        v = _num(row.get("requests"))
    return int(v or 0)


def _met(row: Mapping[str, Any]) -> int:
    """The requests of a row that met every SLO: ``slo_met``, or from a proxy that did not
    send it (it is not in the interface's snapshot) its ``slo_attainment`` times
    :func:`_judged`; 0 when it has neither."""
    v = _num(row.get("slo_met"))
    if v is None:
        share = _num(row.get("slo_attainment"))
        v = round(share * _judged(row)) if share is not None else 0
    return int(v)


def _max(values: Iterable[object]) -> float | None:
    nums = [v for v in (_num(x) for x in values) if v is not None]
    return max(nums) if nums else None


def merge_histogram_texts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Decode and add encoded histograms: ``(sorted hdr indices, counts)``."""
    parts = [decode_sparse(t) for t in texts if t]
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return compact(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _merge_rows(rows: list[Mapping[str, Any]], key: str, pcts: Sequence[str]) -> dict[str, Any]:
    """Merge user (or model) rows that share ``row[key]``."""
    out: dict[str, Any] = {key: rows[0][key]}
    for k in _ROW_SUM_KEYS:
        if any(k in r for r in rows):
            out[k] = _sum(r.get(k) for r in rows) or 0
    judged = out["slo_judged"] = sum(_judged(r) for r in rows)
    met = out["slo_met"] = sum(_met(r) for r in rows)
    out["slo_attainment"] = met / judged if judged else None
    if any("tracked" in r for r in rows):  # all folds or none (see _group_rows)
        out["tracked"] = rows[0].get("tracked") is not False
    hists = [r.get("histograms") for r in rows]
    if len(rows) > 1 and all(isinstance(h, Mapping) for h in hists):
        merged_h: dict[str, str] = {}
        for name in METRIC_NAMES:
            idx, cnt = merge_histogram_texts([h[name] for h in hists if isinstance(h, Mapping)
                                              and isinstance(h.get(name), str)])
            merged_h[name] = encode_sparse(idx, cnt)
            s = summary_seconds(idx, cnt)
            for p in ("p50", "p95", "p99"):
                field = f"{name}_{p}"
                if field in pcts:
                    out[field] = s[p]
        out["histograms"] = merged_h
    else:
        for field in pcts:
            out[field] = _max(r.get(field) for r in rows)
        if len(rows) > 1:
            out["approximate"] = True
        elif isinstance(hists[0], Mapping):
            out["histograms"] = dict(hists[0])
    return out


def _group_rows(snaps: Sequence[Mapping[str, Any]], section: str, key: str,
                pcts: Sequence[str]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, bool], list[Mapping[str, Any]]] = {}
    for s in snaps:
        for row in s.get(section) or []:
            if isinstance(row, Mapping) and isinstance(row.get(key), str):
                # the fold apart from a real user named like it
                groups.setdefault((row[key], row.get("tracked") is False), []).append(row)
    merged = [_merge_rows(rows, key, pcts) for rows in groups.values()]
    merged.sort(key=lambda r: (-(r.get("output_tps") or 0), -(r.get("requests") or 0), r[key]))
    return merged


def _merge_engines(snaps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_upstream: dict[str, Mapping[str, Any]] = {}
    for s in snaps:
        e = s.get("engine")
        if not isinstance(e, Mapping) or e.get("kind") is None:
            continue
        up = str(s.get("upstream") or "")
        old = by_upstream.get(up)
        if old is None or (_num(e.get("t")) or 0) > (_num(old.get("t")) or 0):
            by_upstream[up] = e
    engines = list(by_upstream.values())
    if not engines:  # why there is no reading: the first proxy that says
        status = next((e.get("status") for s in snaps
                       if isinstance(e := s.get("engine"), Mapping) and e.get("status")), None)
        return {"kind": None, "running": None, "waiting": None, "kv_cache_usage": None,
                "preemptions": None, "ttft_p95": None, "t": None, "age_s": None,
                "status": status}
    if len(engines) == 1:
        return dict(engines[0])
    kinds = {e.get("kind") for e in engines}
    return {
        "kind": kinds.pop() if len(kinds) == 1 else "mixed",
        "running": _sum(e.get("running") for e in engines),
        "waiting": _sum(e.get("waiting") for e in engines),
        "kv_cache_usage": _max(e.get("kv_cache_usage") for e in engines),
        "preemptions": _sum(e.get("preemptions") for e in engines),
        "ttft_p95": _max(e.get("ttft_p95") for e in engines),
        "t": _max(e.get("t") for e in engines),
        "age_s": _max(e.get("age_s") for e in engines),
        "engines": len(engines),
        "status": f"{len(engines)} engines",
    }


def _merge_gpus(snaps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    gpus: dict[tuple[str, int], Mapping[str, Any]] = {}
    for s in snaps:
        for g in s.get("gpus") or []:
            if not isinstance(g, Mapping) or not isinstance(g.get("index"), int):
                continue
            k = (str(g.get("host") or s.get("host") or ""), int(g["index"]))
            old = gpus.get(k)
            if old is None or (_num(g.get("t")) or 0) > (_num(old.get("t")) or 0):
                gpus[k] = g
    return [dict(gpus[k]) for k in sorted(gpus)]


def _merge_recordings(recordings: list[Any]) -> Any:
    """The first proxy's recording status; with several recording, its path names how many
    more (QA: `attach A B` showed only A's file although B recorded too) and ``paths``
    lists them all. A recording that stopped writing on any proxy is the merged ``error``
    (its file named), and ``others_writing`` joins each one's: the screens' REC FAILED and
    REC SHARED were the first proxy's alone."""
    if len(recordings) < 2 or not all(isinstance(r, dict) for r in recordings):
        return recordings[0] if recordings else None
    paths = [str(r.get("path") or "") for r in recordings]
    errors = [f"{p}: {r['error']}" for p, r in zip(paths, recordings, strict=True)
              if r.get("error")]
    others = [str(x) for r in recordings if isinstance(r.get("others_writing"), list)
              for x in r["others_writing"]]
    return {**recordings[0], "path": f"{paths[0]} (+{len(paths) - 1} more)", "paths": paths,
            "error": "; ".join(errors) or None, "others_writing": others}


def _merge_warnings(snaps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for s in snaps:
        for w in s.get("warnings") or []:
            if not isinstance(w, Mapping) or not isinstance(w.get("code"), str):
                continue
            cur = out.get(w["code"])
            if cur is None:
                out[w["code"]] = dict(w)
                continue
            sev, cur_sev = str(w.get("severity")), str(cur.get("severity"))
            if _SEVERITY.get(sev, 1) > _SEVERITY.get(cur_sev, 1):
                cur["severity"] = w.get("severity")
                cur["message"] = w.get("message")
            since = _num(w.get("since"))
            cur_since = _num(cur.get("since"))
            if since is not None and (cur_since is None or since < cur_since):
                cur["since"] = since
    return sorted(out.values(), key=lambda w: (_num(w.get("since")) or 0, w["code"]))


def _merge_series(snaps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    points: dict[float, list[Mapping[str, Any]]] = {}
    for s in snaps:
        for p in s.get("series") or []:
            if isinstance(p, Mapping) and _num(p.get("t")) is not None:
                points.setdefault(float(p["t"]), []).append(p)
    out = []
    for t in sorted(points):
        ps = points[t]
        row: dict[str, Any] = {"t": t}
        for k in _SERIES_SUM:
            row[k] = _sum(p.get(k) for p in ps)
        for k in ("ttft_p95", "itl_p95"):
            row[k] = _max(p.get(k) for p in ps)
        out.append(row)
    return out


_SECTIONS: Final = (
    ("system", Mapping), ("latency", Mapping), ("histograms", Mapping), ("capacity", Mapping),
    ("engine", Mapping), ("slo", Mapping), ("users", list), ("models", list), ("gpus", list),
    ("warnings", list), ("series", list),
)


def _check_part(s: object) -> None:
    """ValueError naming what is wrong when ``s`` is not shaped like a snapshot (a missing
    section is fine: an older llmtop)."""
    if not isinstance(s, Mapping):
        raise ValueError("a proxy's snapshot is malformed: not an object")
    w = s.get("window_s")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int | float)):
        raise ValueError("a proxy's snapshot is malformed: window_s is not a number")
    for key, kind in _SECTIONS:
        v = s.get(key)
        if v is not None and not isinstance(v, kind):
            what = "an object" if kind is Mapping else "a list"
            raise ValueError(f"a proxy's snapshot is malformed: '{key}' is not {what}")


def _proxy_key(s: Mapping[str, Any]) -> tuple[str, float, str] | None:
    """What tells one running proxy from another: its host, the instant its aggregator
    started (unix seconds, sub-microsecond) and its upstream; None when it does not say."""
    started = _num(s.get("started_at"))
    if started is None:
        return None
    return str(s.get("host") or ""), float(started), str(s.get("upstream") or "")


def _once_per_proxy(snaps: Sequence[Mapping[str, Any]]
                    ) -> tuple[list[Mapping[str, Any]], dict[str, Any] | None]:
    """``snaps`` with every proxy's snapshot once (the first), and the warning to show when
    some proxy came more than once (None otherwise)."""
    seen: dict[tuple[str, float, str], int] = {}
    kept: list[Mapping[str, Any]] = []
    for s in snaps:
        key = _proxy_key(s)
        if key is not None and key in seen:
            seen[key] += 1
            continue
        if key is not None:
            seen[key] = 1
        kept.append(s)
    twice = {k: n for k, n in seen.items() if n > 1}
    if not twice:
        return kept, None
    names = ", ".join(f"{host or '?'} in front of {up or '?'} ({n} addresses)"
                      for (host, _, up), n in twice.items())
    return kept, {
        "code": "DUPLICATE_PROXY", "severity": "warning",
        "since": _max(s.get("time") for s in snaps),
        "message": f"the same proxy is attached more than once: {names}; each proxy is "
                   "counted once — give each proxy's admin address once",
    }


def merge_snapshots(snaps: Sequence[Mapping[str, Any]], *,
                    once_per_proxy: bool = False) -> dict[str, Any]:
    """One snapshot for several proxies (see the module docstring for each field's rule).

    ``once_per_proxy`` (``llmtop attach``): snapshots of one running proxy (the same host,
    start instant and upstream: one proxy reached by two addresses, ``localhost`` and
    ``127.0.0.1``, or a name and its IP) count once, and a ``DUPLICATE_PROXY`` warning says
    so; without it every snapshot counts (callers that merge synthetic snapshots).

    Raises ``ValueError`` for no snapshots, different windows, undecodable histograms or a
    snapshot that is not shaped like one (``llmtop attach`` then leaves that proxy out,
    named with the reason, and merges the others: any other exception would blank the
    whole view with a Python error)."""
    if not snaps:
        raise ValueError("no snapshots to merge")
    for s in snaps:
        _check_part(s)
    note: dict[str, Any] | None = None
    if once_per_proxy:
        snaps, note = _once_per_proxy(snaps)
    try:
        merged = _merge(snaps)
    except (TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        raise ValueError(
            f"a proxy's snapshot is malformed ({type(exc).__name__}: {exc})") from None
    for w in (note, _mixed_slos(snaps)):
        if w is not None:
            merged["warnings"].append(w)
    return merged


def _slo_spec(slo: Mapping[str, Any]) -> str:
    """``ttft=0.5,itl_p95=0.05,target=0.95`` (the ``--slo`` form)."""
    return ",".join(f"{k.removesuffix('_s')}={v:g}" for k, v in sorted(slo.items())
                    if _num(v) is not None) or "none"


def _mixed_slos(snaps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A ``MIXED_SLO`` warning when the proxies judge requests by different SLOs (None when
    they agree, or do not say)."""
    specs: dict[str, int] = {}
    for s in snaps:
        slo = s.get("slo")
        if isinstance(slo, Mapping) and slo:
            spec = _slo_spec(slo)
            specs[spec] = specs.get(spec, 0) + 1
    if len(specs) < 2:
        return None
    each = "; ".join(f"{spec} on {n} prox{'y' if n == 1 else 'ies'}"
                     for spec, n in specs.items())
    return {
        "code": "MIXED_SLO", "severity": "warning",
        "since": _max(s.get("time") for s in snaps),
        "message": f"the proxies' SLOs differ ({each}): SLO attainment, goodput and capacity "
                   "add up requests judged by different objectives, and the SLO shown is the "
                   "first proxy's — give every proxy the same [slo] (one --config)",
    }


def _merge(snaps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    windows = {s.get("window_s") for s in snaps}
    if len(windows) != 1:
        raise ValueError(f"snapshots cover different windows: {sorted(map(str, windows))}")
    window_s = windows.pop()
    first = snaps[0]

    hist_out: dict[str, str] = {}
    latency: dict[str, Any] = {}
    for name in METRIC_NAMES:
        texts = [str((s.get("histograms") or {}).get(name) or "") for s in snaps]
        idx, cnt = merge_histogram_texts(texts)
        hist_out[name] = encode_sparse(idx, cnt)
        latency[name] = summary_seconds(idx, cnt)

    systems = [s.get("system") or {} for s in snaps]
    keys = sorted({k for sy in systems for k in sy})
    system: dict[str, Any] = {}
    for k in keys:
        vals = [sy.get(k) for sy in systems]
        if k == "span_s":
            system[k] = _max(vals)
        elif k != "slo_attainment":  # maxima and means sum too: upper bound / total mean
            system[k] = _sum(vals)
    for k in ("requests", "errors", "cancelled", "timeouts", "slo_met", "in_flight", "waiting",
              "streaming"):
        system[k] = int(system.get(k) or 0)
    for k in ("rps", "output_tps", "input_tps", "goodput_rps", "goodput_tps",
              "finished_output_tps"):
        system[k] = float(system.get(k) or 0.0)
    judged = system["slo_judged"] = sum(_judged(sy) for sy in systems)
    met = system["slo_met"] = sum(_met(sy) for sy in systems)
    system["slo_attainment"] = met / judged if judged else None

    slo_d = _mapping(first.get("slo"))
    cap_first = _mapping(first.get("capacity"))
    target = _num(cap_first.get("target")) or Slo.from_dict(slo_d).target
    min_req = int(_num(cap_first.get("min_requests_per_bin")) or capacity.MIN_REQUESTS_PER_BIN)
    bins = capacity.merge_bins(
        (s.get("capacity") or {}).get("bins") or [] for s in snaps
    )

    upstreams = sorted({str(s.get("upstream") or "") for s in snaps})
    starts = [v for v in (_num(s.get("started_at")) for s in snaps) if v is not None]
    recordings = [s.get("recording") for s in snaps if s.get("recording")]
    return {
        "version": 1,
        "time": _max(s.get("time") for s in snaps),
        "window_s": window_s,
        "system": system,
        "latency": latency,
        "users": _group_rows(snaps, "users", "user",
                             ("ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p95",
                              "itl_p99", "tpot_p95", "e2e_p95")),
        "gpus": _merge_gpus(snaps),
        # each proxy's GPU line, once ("2 GPUs · GPU 1 lost")
        "gpu_status": " · ".join(dict.fromkeys(
            str(s["gpu_status"]) for s in snaps if s.get("gpu_status"))) or None,
        "engine": _merge_engines(snaps),
        "capacity": capacity.estimate(bins, target, min_req),
        "warnings": _merge_warnings(snaps),
        "histograms": hist_out,
        "models": _group_rows(snaps, "models", "model", ("ttft_p95", "itl_p95", "e2e_p95")),
        "series": _merge_series(snaps),
        "slo": dict(slo_d),
        "upstream": upstreams[0] if len(upstreams) == 1 else "",
        "upstreams": upstreams,
        "hosts": sorted({str(s.get("host") or "") for s in snaps}),
        "started_at": min(starts) if starts else None,
        "uptime_s": _max(s.get("uptime_s") for s in snaps),
        "top_users": _max(s.get("top_users") for s in snaps),
        # an upper bound: a user folded on two proxies counts twice
        "users_untracked": _sum(s.get("users_untracked") for s in snaps),
        "clamped_values": int(_sum(s.get("clamped_values") for s in snaps) or 0),
        "recording": _merge_recordings(recordings),
        "sources": len(snaps),
    }
