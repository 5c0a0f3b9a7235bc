"""Two recordings side by side — and a warning, not a quiet ratio, when their conditions
differ.

A figure without its conditions is meaningless (``shared/docs/domain.md``): before any
ratio is shown, :func:`condition_warnings` compares the models, SLOs, input and output
length distributions, concurrency ranges, arrival rates, streaming share, token counting,
GPUs and engine. When any differ, the ratio column is withheld and the differences are
printed first; the two columns of figures are still shown. When the SLOs are all that
differ (the same workload judged against other targets), only the figures judged against
them (:data:`SLO_JUDGED`) lose their ratio: latency, throughput and errors compare as they
are. The arrival rate compared is the load's, over the time its requests ran, and only
where it is a condition: not between two closed loops (:func:`closed_loop`: there it is
the server's speed, and the concurrency is the load), between two bench recordings the
rates their benchmarks offered (:func:`offered_loads`), and a difference within the noise
of one random schedule (:func:`within_noise`) is one load, said in a note. When the
recordings' idle time around the load differs, only the rates over each whole recording
(:data:`SPAN_RATES`) lose their ratio, and a note says why; :data:`BUSY_TPS` is the
throughput over the requests' own time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from llmtop.recording.report.fmt import (
    MAX_LISTED,
    NA,
    PERCENTILE_NOTE,
    attainment,
    before_start_note,
    compact,
    compact_all,
    dist,
    duration,
    few,
    file_notes,
    no_footer,
    num,
    pct,
    secs,
    slo_text,
)
from llmtop.recording.report.text import lines_text, table

TOLERANCE: Final = 0.20
"""Relative difference above which two length distributions / loads count as different."""


def _rel_diff(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return None
    hi = max(abs(a), abs(b))
    return 0.0 if hi == 0 else abs(a - b) / hi


def _dominant(counts: dict[str, int]) -> str | None:
    return max(counts, key=lambda k: counts[k]) if counts else None


def served_models(c: dict[str, Any]) -> set[str]:
    """The models a recording's successful requests were served by (all its models when
    none succeeded): a failed request records the name the client asked for — an alias,
    a placeholder such as ``m`` — not the engine's, so it says nothing about what ran."""
    ok = c.get("models_ok")
    return set(ok) if ok else set(c["models"])


def arrival_rate(c: dict[str, Any]) -> Any:
    """The load's arrival rate: over the time its requests ran (``rps_busy``), not over
    the whole recording, whose idle time before the load began (the proxy started, then
    the benchmark) is no part of the workload: the same load recorded after a 2.5 s and a
    12 s wait read 3.81 and 2.02 req/s over the recording, and was withheld as another
    workload. Without it (a report from before it; requests that took no time at all) the
    mean over the recording."""
    arr = c["arrival"]
    busy = arr.get("rps_busy")
    return busy if busy is not None else arr.get("rps_mean")


CLOSED_LOOP: Final = 0.5
"""The share of requests sent as another ended (``after_end_share``) from which a
recording's traffic is taken for a closed loop."""


def closed_loop(c: dict[str, Any]) -> bool:
    """The recording's requests came from a closed loop (clients that each send their next
    request when the last one ends: bench --concurrency, most load testers): its arrival
    rate is then the server's speed, an outcome and not a condition; its load is its
    concurrency. A bench recording says so in its header; a proxy's recording shows it
    (``after_end_share``: 0.9 for bench --concurrency 4 with 40 requests, 0.1 or less
    for --rate 4)."""
    bench = (c.get("extra") or {}).get("bench")
    if isinstance(bench, dict) and isinstance(bench.get("arrivals"), str):
        return bool(bench["arrivals"] == "closed-loop")
    share = c["arrival"].get("after_end_share")
    return isinstance(share, int | float) and share >= CLOSED_LOOP


def within_noise(ca: dict[str, Any], cb: dict[str, Any]) -> bool:
    """The two arrival rates differ by no more than two standard errors of their
    difference, and neither is 1.5 times the other: what two draws of one random schedule
    give. A rate over T seconds of a Poisson process λ varies by λ/T, scaled by the
    arrivals' dispersion index over their own seconds (1 Poisson, about 0 a constant rate,
    which then varies by nothing). 40 requests at --rate 4 drew 4.32 and 3.40 req/s with
    two seeds, 1.1 standard errors apart; with so few requests, rates 1.4 times apart can
    be one load as well as two."""
    var = 0.0
    rates: list[float] = []
    for c in (ca, cb):
        arr = c["arrival"]
        rate, busy = arrival_rate(c), arr.get("busy_s")
        if (not isinstance(rate, int | float) or rate <= 0 or not isinstance(busy, int | float)
                or busy <= 0):
            return False
        disp = arr.get("dispersion_busy")
        var += (disp if isinstance(disp, int | float) else 1.0) * rate / busy
        rates.append(float(rate))
    return (max(rates) < 1.5 * min(rates)
            and abs(rates[0] - rates[1]) <= 2 * math.sqrt(var))


def offered_loads(ca: dict[str, Any], cb: dict[str, Any]) -> tuple[str, str] | None:
    """Both recordings' load as their benchmark scheduled it, when both are bench
    recordings of fixed open-loop levels (--rate, no --search): the rates asked for are
    the condition, not the rates a Poisson schedule happened to draw (40 requests at
    --rate 4 with two seeds drew 4.32 and 3.40 req/s: 'different arrival rates'). None
    otherwise."""
    out = []
    for c in (ca, cb):
        bench = (c.get("extra") or {}).get("bench")
        if (not isinstance(bench, dict) or bench.get("mode") != "rate" or bench.get("search")
                or not isinstance(bench.get("levels"), list)):
            return None
        levels = ", ".join(num(v, 2) if isinstance(v, int | float) else compact(str(v))
                           for v in bench["levels"][:MAX_LISTED])
        more = len(bench["levels"]) - MAX_LISTED
        out.append(f"--rate {levels}{f', … and {more} more' if more > 0 else ''} req/s "
                   f"({compact(str(bench.get('arrivals')))})")
    return out[0], out[1]


def _names(names: Any, other: Any) -> str:
    """``names`` for a warning that they differ from ``other``: sorted, and when they
    are too many to list (:data:`~fmt.MAX_LISTED`), those not in ``other`` first."""
    ordered = sorted(names)
    if len(ordered) > MAX_LISTED:
        ordered = sorted(set(names) - set(other)) + sorted(set(names) & set(other))
    return few(ordered)


def condition_warnings(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Every way the two recordings' conditions differ enough to make ratios misleading."""
    ca, cb = a["conditions"], b["conditions"]
    out: list[str] = []
    ma, mb = served_models(ca), served_models(cb)
    if ma != mb:  # (names compared whole, shown compact: a 5,000-character GPU name too)
        out.append(f"different models: A {_names(ma, mb)}; B {_names(mb, ma)}")
    if ca["slo"] != cb["slo"]:
        out.append(f"different SLOs: A {slo_text(ca['slo'])}; B {slo_text(cb['slo'])} — "
                   "attainment, goodput and capacity are judged against different targets")
    for key, label in (("prompt_tokens", "input"), ("completion_tokens", "output")):
        da, db = ca[key], cb[key]
        diffs = [_rel_diff(da.get(q), db.get(q)) for q in ("p50", "p90")]
        if any(d is not None and d > TOLERANCE for d in diffs):
            out.append(f"different {label} length distributions: A {dist(da)}; B {dist(db)}")
    qa, qb = ca["concurrency_at_start"], cb["concurrency_at_start"]
    if any((_rel_diff(qa.get(k), qb.get(k)) or 0) > TOLERANCE for k in ("min", "max", "p50")):
        out.append(f"different concurrency ranges: A {num(qa.get('min'), 0)}–"
                   f"{num(qa.get('max'), 0)} (p50 {num(qa.get('p50'), 0)}); B "
                   f"{num(qb.get('min'), 0)}–{num(qb.get('max'), 0)} "
                   f"(p50 {num(qb.get('p50'), 0)})")
    offered = offered_loads(ca, cb)
    if offered is not None:  # both benchmarks' own schedules: what they offered, compared
        if offered[0] != offered[1]:
            out.append(f"different offered loads: A {offered[0]}; B {offered[1]}")
    elif not (closed_loop(ca) and closed_loop(cb)):
        ra, rb = arrival_rate(ca), arrival_rate(cb)
        if (_rel_diff(ra, rb) or 0) > TOLERANCE and not within_noise(ca, cb):
            out.append(f"different arrival rates: A {num(ra, 2)} req/s; B {num(rb, 2)} req/s")
    sa, sb = ca.get("streaming_share"), cb.get("streaming_share")
    if (_rel_diff(sa, sb) or 0) > TOLERANCE:
        out.append(f"different streaming share: A {pct(sa)}; B {pct(sb)}")
    ta, tb = _dominant(ca["token_source"]), _dominant(cb["token_source"])
    if ta and tb and ta != tb:
        out.append(f"output tokens counted differently: A from {ta}, B from {tb}")
    ga = sorted(g.split(": ", 1)[-1] for g in ca["gpus"])
    gb = sorted(g.split(": ", 1)[-1] for g in cb["gpus"])
    if ga and gb and ga != gb:
        out.append(f"different GPUs: A {_names(ga, gb)}; B {_names(gb, ga)}")
    ea, eb = ca.get("engine_kind"), cb.get("engine_kind")
    if ea and eb and ea != eb:
        out.append(f"different engines: A {compact(ea)}; B {compact(eb)}")
    return out


PEAK: Final = "peak output tok/s"
"""The figure taken over each recording's series windows (their length grows with the
recording's: 10 s, 60 s, 300 s)."""


def peak_windows(a: dict[str, Any], b: dict[str, Any]) -> tuple[Any, Any] | None:
    """The two recordings' series windows (s) when they differ — their peak rates are then
    the busiest 10 s against the busiest minute, say, and have no ratio — else None."""
    wa = (a.get("throughput") or {}).get("series_window_s")
    wb = (b.get("throughput") or {}).get("series_window_s")
    return (wa, wb) if wa != wb else None


SPAN_RATES: Final = frozenset({"system output tok/s", "requests/s", "goodput tok/s"})
"""The figures divided by each recording's span (its start to its last event)."""


def busy_shares(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float] | None:
    """The shares of A's and B's spans that their requests ran in, when they differ by more
    than :data:`TOLERANCE` — their rates over the span then differ by the idle time each
    recording had around the load, not by the server (the same load after a 12 s wait
    read 0.53× the tok/s of one after 2.5 s) — else None."""
    shares = []
    for r in (a, b):
        arr = r["conditions"]["arrival"]
        busy, span = arr.get("busy_s"), arr.get("span_s")
        if not isinstance(busy, int | float) or not isinstance(span, int | float) or span <= 0:
            return None
        shares.append(min(1.0, busy / span))
    return (shares[0], shares[1]) if (_rel_diff(*shares) or 0) > TOLERANCE else None


def notes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Things worth knowing that do not invalidate a comparison."""
    out = []
    if (shares := busy_shares(a, b)) is not None:
        out.append(f"the requests ran over {pct(shares[0])} of A's recording and "
                   f"{pct(shares[1])} of B's (idle time before or after the load): "
                   f"{', '.join(sorted(SPAN_RATES))}, rates over each recording's whole "
                   f"span, have no ratio ({BUSY_TPS} is over the requests' own time)")
    windows = peak_windows(a, b)
    if windows is not None:
        out.append(f"{PEAK}: over {num(windows[0], 0)} s windows in A, {num(windows[1], 0)} s "
                   "in B (the series' window grows with a recording's length): no ratio")
    ca, cb = a["conditions"], b["conditions"]
    ra, rb = arrival_rate(ca), arrival_rate(cb)
    if (_rel_diff(ra, rb) or 0) > TOLERANCE and (offered := offered_loads(ca, cb)) is not None:
        if offered[0] == offered[1]:
            out.append(f"arrival rates: A {num(ra, 2)} req/s; B {num(rb, 2)} req/s — both "
                       f"benchmarks offered {offered[0]}: the rates their schedules drew")
    elif (_rel_diff(ra, rb) or 0) > TOLERANCE and closed_loop(ca) and closed_loop(cb):
        out.append(f"arrival rates: A {num(ra, 2)} req/s; B {num(rb, 2)} req/s — both closed "
                   "loops (each request sent as another ended), whose rate is the server's "
                   "speed: the load compared is their concurrency")
    elif (_rel_diff(ra, rb) or 0) > TOLERANCE and within_noise(ca, cb):
        out.append(f"arrival rates: A {num(ra, 2)} req/s; B {num(rb, 2)} req/s — within two "
                   f"standard errors of one random schedule over {num(ca['requests'], 0)} and "
                   f"{num(cb['requests'], 0)} requests: compared as one load")
    if a["conditions"]["upstream"] != b["conditions"]["upstream"]:
        out.append(f"upstreams: A {compact(a['conditions']['upstream'] or NA)}; "
                   f"B {compact(b['conditions']['upstream'] or NA)}")
    for tag, r in (("A", a), ("B", b)):
        n = r["conditions"]["requests"]
        if n == 0:
            out.append(f"{tag} has no requests: there is nothing of it to compare")
        elif n < 100:
            out.append(f"{tag} has only {n} request{'' if n == 1 else 's'}: its tail "
                       "percentiles are noisy")
        if not r["source"]["complete"]:
            out.append(f"{tag} has {no_footer(r['source'])}")
        if (early := before_start_note(r["conditions"])) is not None:
            out.append(f"{tag}: {early}")
    for tag, r in (("A", a), ("B", b)):  # what each file's reader skipped, as a report says
        out += [f"{tag} ({r['source']['file']}): {n}" for n in file_notes(r["source"])]
    return out


def _get(path: str) -> Callable[[dict[str, Any]], Any]:
    def get(r: dict[str, Any]) -> Any:
        cur: Any = r
        for p in path.split("."):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(p)
        return cur

    return get


def _gpu_peak(key: str) -> Callable[[dict[str, Any]], Any]:
    def get(r: dict[str, Any]) -> Any:
        vals = [g.get(key) for g in r["gpus"] if isinstance(g.get(key), int | float)]
        return max(vals) if vals else None

    return get


def _gib(v: Any) -> float | None:
    return v / 2**30 if isinstance(v, int | float) else None


ATTAINMENT: Final = "SLO attainment"
BUSY_TPS: Final = "output tok/s while busy"
"""The output over the time the requests ran (the first one's start to the last one's
end): the rate to compare when the recordings' idle time differs (SPAN_RATES)."""

FIGURES: Final[list[tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str], bool]]] = [
    # (label, getter, formatter, lower is better)
    *[(f"{name} {q}", _get(f"latency.{key}.{q}"), secs, True)
      for key, name in (("ttft", "TTFT"), ("itl", "ITL"), ("chunk_gap", "chunk gap"),
                        ("tpot", "TPOT"), ("e2e", "E2E"))
      for q in ("p50", "p95", "p99")],
    ("system output tok/s", _get("throughput.output_tps"), num, False),
    (BUSY_TPS, _get("throughput.output_tps_busy"), num, False),
    (PEAK, _get("throughput.output_tps_peak"), num, False),
    ("requests/s", _get("throughput.rps"), lambda v: num(v, 2), False),
    (ATTAINMENT, _get("slo.attainment"), pct, False),
    ("goodput tok/s", _get("slo.goodput_tps"), num, False),
    ("error rate", _get("outcomes.error_rate"), pct, True),
    ("timeout rate", _get("outcomes.timeout_rate"), pct, True),
    ("max concurrency at SLO", _get("capacity.max_concurrency_at_slo"),
     lambda v: "none" if v == 0 else num(v, 0), False),  # 0: even the lowest level fails
    ("goodput tok/s at SLO", _get("capacity.goodput_tps_at_slo"), num, False),
    ("GPU memory peak (GiB)", lambda r: _gib(_gpu_peak("mem_used_peak_bytes")(r)), num, True),
    ("DRAM bandwidth peak %", _gpu_peak("dram_bw_util_peak"), num, True),
]


SLO_JUDGED: Final = frozenset({"SLO attainment", "goodput tok/s", "max concurrency at SLO",
                               "goodput tok/s at SLO"})
"""The figures judged against the SLOs: the only ones whose ratio different SLOs spoil."""


def slo_only(warnings: list[str]) -> bool:
    """The conditions differ in the SLOs alone (see :func:`condition_warnings`)."""
    return bool(warnings) and all(w.startswith("different SLOs") for w in warnings)


def comparison(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The comparison as data: warnings, notes, and each figure for A and B with B/A
    (``ratio`` is None when the conditions differ — see ``warnings`` — except, when only
    the SLOs differ, for the figures not judged against them)."""
    warnings = condition_warnings(a, b)
    only_slo = slo_only(warnings)
    other_windows = peak_windows(a, b) is not None
    other_busy = busy_shares(a, b) is not None
    rows = []
    targets = (_get("slo.target")(a), _get("slo.target")(b))
    for label, get, _fmt, lower_better in FIGURES:
        va, vb = get(a), get(b)
        ratio = None
        comparable = not warnings or (only_slo and label not in SLO_JUDGED)
        withheld = (not comparable or (label == PEAK and other_windows)
                    or (label in SPAN_RATES and other_busy))
        if not withheld and isinstance(va, int | float) and isinstance(vb, int | float) and va:
            ratio = vb / va
        rows.append({"figure": label, "a": va, "b": vb, "ratio_b_over_a": ratio,
                     "lower_is_better": lower_better, "withheld": withheld})
    la, lb = a["source"]["file"], b["source"]["file"]
    sa, sb = a["source"].get("series"), b["source"].get("series")
    if la == lb and sa is not None and sb is not None and sa != sb:
        # one stem before and after a restart (report STEM STEM --series 1,2)
        la, lb = f"{la} (series {sa})", f"{lb} (series {sb})"
    return {
        "comparison_version": 1,
        "a": la,
        "b": lb,
        "conditions_match": not warnings,
        "slo_only_differs": only_slo,
        "warnings": warnings,
        "notes": notes(a, b),
        "figures": rows,
        "slo_targets": list(targets),
        "percentiles": PERCENTILE_NOTE,
    }


def condition_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, str]]:
    ca, cb = a["conditions"], b["conditions"]

    def models(c: dict[str, Any]) -> str:
        return few(c["models"])

    def conc(c: dict[str, Any]) -> str:
        q = c["concurrency_at_start"]
        return f"{num(q.get('min'), 0)}–{num(q.get('max'), 0)} (p50 {num(q.get('p50'), 0)})"

    def arrivals(c: dict[str, Any]) -> str:
        arr = c["arrival"]
        if arr.get("rps_busy") is None:
            return num(arr.get("rps_mean"), 2)
        return (f"{num(arr['rps_busy'], 2)} over {duration(arr.get('busy_s'))} of requests "
                f"({num(arr.get('rps_mean'), 2)} over the recording)")

    return [
        ("upstream", ca["upstream"] or NA, cb["upstream"] or NA),
        ("models", models(ca), models(cb)),
        ("SLOs", slo_text(ca["slo"]), slo_text(cb["slo"])),
        ("requests", num(ca["requests"], 0), num(cb["requests"], 0)),
        ("input tokens", dist(ca["prompt_tokens"]), dist(cb["prompt_tokens"])),
        ("output tokens", dist(ca["completion_tokens"]), dist(cb["completion_tokens"])),
        ("concurrency at start", conc(ca), conc(cb)),
        ("arrivals (req/s)", arrivals(ca), arrivals(cb)),
        ("GPUs", "; ".join(ca["gpus"]) or NA, "; ".join(cb["gpus"]) or NA),
        ("engine", ca.get("engine_kind") or NA, cb.get("engine_kind") or NA),
    ]


def figure_rows(cmp: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    fmts = {label: fmt for label, _g, fmt, _l in FIGURES}
    out = []
    for row in cmp["figures"]:
        fmt = fmts[row["figure"]]
        ratio = row["ratio_b_over_a"]
        shown = (f"{ratio:.2f}×" if ratio is not None
                 else ("withheld" if row.get("withheld", not cmp["conditions_match"])
                       else NA))
        if row["figure"] == ATTAINMENT:  # never rounded onto its target (fmt.attainment)
            ta, tb = cmp.get("slo_targets") or (None, None)
            out.append((row["figure"], attainment(row["a"], ta), attainment(row["b"], tb),
                        shown))
            continue
        out.append((row["figure"], fmt(row["a"]), fmt(row["b"]), shown))
    return out


def shown(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The comparison of ``a`` and ``b``, and the two reports, as the text and HTML show
    them: judged on the whole names, every name then :func:`~fmt.compact` (the warnings and
    notes already shorten the names they quote)."""
    cmp = comparison(a, b)
    cmp["a"], cmp["b"] = compact(cmp["a"]), compact(cmp["b"])
    return cmp, compact_all(a), compact_all(b)


def render_compare_text(a: dict[str, Any], b: dict[str, Any]) -> str:
    cmp, a, b = shown(a, b)
    out = ["llmtop report — comparison", f"  A: {cmp['a']}", f"  B: {cmp['b']}", ""]
    if cmp["warnings"] and cmp["slo_only_differs"]:
        out.append("WARNING: the recordings are judged against different SLOs; the B/A "
                   "ratios of SLO attainment, goodput and capacity are withheld (they would "
                   "compare different targets):")
        out += [f"  ! {w}" for w in cmp["warnings"]]
        out.append("")
    elif cmp["warnings"]:
        out.append("WARNING: the recordings were made under different conditions; the B/A "
                   "ratios are withheld (they would compare different workloads):")
        out += [f"  ! {w}" for w in cmp["warnings"]]
        out.append("")
    if cmp["notes"]:
        out.append("NOTES")
        out += [f"  - {n}" for n in cmp["notes"]]
        out.append("")
    out.append("CONDITIONS")
    out += table(condition_rows(a, b), ("", "A", "B"), left=True)
    out.append("")
    out.append("FIGURES")
    out += table(figure_rows(cmp), ("", "A", "B", "B/A"))
    out.append(f"  (latency {PERCENTILE_NOTE})")
    out.append("")
    return lines_text(out)
