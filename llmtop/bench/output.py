"""What ``llmtop bench`` prints: the per-level table, failures by kind, GPU lines, verdict."""

from __future__ import annotations

from llmtop.bench.search import SearchResult, not_counted, passes, sent_nothing, unreached
from llmtop.bench.summary import StepSummary, errors_text
from llmtop.config import Config

SLO_NAMES = {"ttft": "TTFT", "itl_p95": "ITL p95", "tpot": "TPOT", "e2e": "E2E"}


def level_text(mode: str, level: float) -> str:
    """``4`` for a concurrency, ``2.5/s`` for a rate."""
    return f"{int(level)}" if mode == "concurrency" else f"{level:g}/s"


def level_label(mode: str, level: float) -> str:
    """``concurrency 4`` or ``rate 2.5/s``."""
    return f"{mode} {level_text(mode, level)}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f}"


def _duration(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def table(result: SearchResult, mode: str) -> list[str]:
    head = (f"{'':2}{mode:>11} {'reqs':>6} {'err':>4} {'rps':>7} {'tok/s':>8} {'goodput':>8} "
            f"{'SLO%':>5} {'TTFT p50':>9} {'p95':>6} {'p99':>6} {'ITL p50':>8} {'p95':>6} "
            f"{'TPOT p50':>9} {'E2E p95':>8}")
    lines = [head, "  " + "(latency in ms; goodput in tok/s)"]
    for s in result.ordered():
        mark = "▶ " if result.best is not None and s is result.best else "  "
        lvl = level_text(mode, s.level)
        lat = s.latency
        att = "n/a" if s.slo_attainment is None else f"{s.slo_attainment * 100:.0f}"
        lines.append(
            f"{mark}{lvl:>11} {s.requests:>6} {s.errors + s.timeouts:>4} {s.rps:>7.2f} "
            f"{s.output_tps:>8.1f} {s.goodput_tps:>8.1f} {att:>5} "
            f"{_ms(lat['ttft'].get('p50')):>9} {_ms(lat['ttft'].get('p95')):>6} "
            f"{_ms(lat['ttft'].get('p99')):>6} {_ms(lat['itl'].get('p50')):>8} "
            f"{_ms(lat['itl'].get('p95')):>6} {_ms(lat['tpot'].get('p50')):>9} "
            f"{_ms(lat['e2e'].get('p95')):>8}"
        )
    return lines


def overflow_text(n: int) -> str:
    """``12 arrivals not sent (too many requests open already)``."""
    return (f"{n:,} arrival{'' if n == 1 else 's'} not sent (too many requests open "
            "already)")


LAG_WARN_S = 0.010
"""An open-loop level whose requests started this late (P99) against their schedule is
flagged: the load generator's own delay is then a visible part of every latency."""


def lag_text(s: StepSummary) -> str | None:
    """``requests started late against their schedule …`` for an open-loop level whose
    load generator fell behind (P99 lag over :data:`LAG_WARN_S`), else ``None``."""
    p99, worst = s.send_lag_p99_s, s.send_lag_max_s
    if p99 is None or worst is None or p99 <= LAG_WARN_S:
        return None
    return (f"the load generator fell behind its schedule (requests started late by "
            f"{_duration(p99)} at P99, {_duration(worst)} at most); every latency here "
            "includes that delay: a lower --rate, or a less busy machine, measures the "
            "server alone")


def unreached_text(s: StepSummary) -> str:
    """``never more than 2 requests open at once (--requests 2 is fewer than the level)``."""
    n = s.peak_open or 0
    return (f"never more than {n} request{'' if n == 1 else 's'} open at once (--requests "
            f"{s.requests} is fewer than the level)")


def nothing_sent_text(levels: list[StepSummary]) -> str:
    """``sent no request: no arrival fell in its 1 s window (…)``, of one level or more."""
    if len(levels) > 1:
        return ("sent no request: no arrival fell in their windows (a longer --duration, "
                "or --requests, measures them)")
    s = levels[0]
    return (f"sent no request: no arrival fell in its {s.duration_s:.2g} s window (about "
            f"{s.level * s.duration_s:.2g} on average at this rate; a longer --duration, "
            "or --requests, measures it)")


def error_lines(result: SearchResult, mode: str) -> list[str]:
    """``errors at concurrency 2: 5 connection refused, 2 HTTP 500`` for levels with any,
    ``at rate 900/s: 12 arrivals not sent …`` for open-loop levels that dropped some, and
    ``at rate 900/s: the load generator fell behind …`` for those that sent late."""
    out = []
    for s in result.ordered():
        if s.error_kinds:
            gave_up = " (gave up early: nothing succeeded)" if s.gave_up else ""
            out.append(f"  errors at {level_label(mode, s.level)}: "
                       f"{errors_text(s.error_kinds)}{gave_up}")
        if s.overflow:
            out.append(f"  at {level_label(mode, s.level)}: {overflow_text(s.overflow)}")
        if (lag := lag_text(s)) is not None:
            out.append(f"  at {level_label(mode, s.level)}: {lag}")
        if unreached(s):
            out.append(f"  at {level_label(mode, s.level)}: {unreached_text(s)}")
    return out


def gpu_lines(result: SearchResult, mode: str) -> list[str]:
    """GPU memory and bandwidth at each level, when readings were in reach: the means of
    the readings inside the level's measured part (:mod:`llmtop.bench.gpu_level`)."""
    out: list[str] = []
    for s in result.ordered():
        for g in s.gpus:
            used, total = g.get("mem_used_bytes"), g.get("mem_total_bytes")
            mem = "n/a" if not used or not total else (
                f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB ({used / total:.0%})")
            bw, peak = g.get("dram_bw_util"), g.get("dram_bw_util_max")
            busy = g.get("mem_busy")
            lvl = level_text(mode, s.level)
            sim = " (simulated)" if g.get("simulated") else ""
            n = g.get("samples")
            over = (f" (mean of {n} readings; memory at its most"
                    + ("" if peak is None or bw is None or peak <= bw
                       else f", bandwidth peak {peak:.0f}%") + ")"
                    if isinstance(n, int) and n > 1 else "")
            out.append(
                f"  GPU {g.get('index')}{sim} at {lvl}: memory {mem}, DRAM bandwidth "
                f"{'n/a' if bw is None else f'{bw:.0f}%'}, memory busy "
                f"{'n/a' if busy is None else f'{busy:.0f}%'}{over}"
            )
    return out


def slo_text(cfg: Config) -> str:
    parts = []
    s = cfg.slo
    if s.ttft_s is not None:
        parts.append(f"TTFT≤{s.ttft_s * 1000:.0f} ms")
    if s.itl_p95_s is not None:
        parts.append(f"ITL p95≤{s.itl_p95_s * 1000:.0f} ms")
    if s.tpot_s is not None:
        parts.append(f"TPOT≤{s.tpot_s * 1000:.0f} ms")
    if s.e2e_s is not None:
        parts.append(f"E2E≤{s.e2e_s:g} s")
    return ", ".join(parts) or "no SLOs"


def why_failed(s: StepSummary, mode: str, target: float) -> str:
    """What kept a level from passing: its failed requests and each objective it missed,
    e.g. ``even concurrency 1 misses TTFT ≤ 150 ms (met by 40% of requests; p95 420 ms)``."""
    lvl = f"even {level_label(mode, s.level)}"
    if s.requests == 0:
        if s.cut_off:
            had = ("none had an answer yet" if not s.cut_off_answered else
                   f"{s.cut_off_answered} had begun to answer")
            return (f"{lvl} finished no request ({s.cut_off} open at the level's end; "
                    f"{had})")
        if sent_nothing(s):
            return f"{lvl} {nothing_sent_text([s])}"
        return f"{lvl} finished no request"
    parts = []
    bad = s.errors + s.timeouts
    if bad:
        parts.append(f"had {bad} of {s.requests} requests fail ({errors_text(s.error_kinds)})")
    if s.overflow:
        parts.append(f"had {overflow_text(s.overflow)}")
    if s.ok and s.no_output == s.ok:  # (its TTFT misses follow from it)
        parts.append(f"got no output in any of its {s.ok} successful answer"
                     f"{'' if s.ok == 1 else 's'} (not a token: is the URL an "
                     "OpenAI-compatible endpoint?)")
        return f"{lvl} " + " and ".join(parts)
    pct = f"p{target * 100:g}"
    misses = []
    for name, d in s.slo_detail.items():
        met, limit, at = d.get("met"), d.get("limit"), d.get("at_target")
        if met is None or limit is None or met >= target:
            continue
        got = "" if at is None else f"; {pct} {_duration(at)}"
        misses.append(f"{SLO_NAMES.get(name, name)} ≤ {_duration(limit)} "
                      f"(met by {met:.0%} of requests{got})")
    if misses:
        parts.append("misses " + "; ".join(misses))
    elif not bad and s.slo_attainment is not None and s.slo_attainment < target:
        parts.append(f"meets each SLO alone, but only {s.slo_attainment:.0%} of requests "
                     "meet all of them")
    return f"{lvl} " + (" and ".join(parts) or "does not pass")


def verdict(result: SearchResult, mode: str, cfg: Config,
            interrupted: str | None = None, interrupted_level: float | None = None) -> str:
    """The one-line answer: the largest level meeting the SLOs, and what qualifies it.

    ``interrupted`` names the level Ctrl-C stopped (``interrupted_level`` its value): one
    between the best level and the lowest failed one (a search bisecting) leaves the limit
    only known to lie between them."""
    what = "concurrency" if mode == "concurrency" else "rate"
    head = f"max {what} meeting {slo_text(cfg)} at {cfg.slo.target:.0%}"
    fail = result.first_fail
    above = [] if fail is None else sorted(
        s.level for s in result.steps
        if s.level > fail.level and passes(s, cfg.slo.target))
    note = "" if fail is None or not above else (
        f" ({', '.join(level_text(mode, x) for x in above)} passed, above the failed "
        f"{level_text(mode, fail.level)}: not counted, the results are not monotonic — "
        "noise or a hiccup; a longer --duration may settle it)")
    gaps = [s for s in result.ordered() if unreached(s) and not_counted(s, cfg.slo.target)]
    unmeasured = "" if not gaps else (
        f" ({what} {', '.join(level_text(mode, s.level) for s in gaps)} not measured: "
        f"{unreached_text(max(gaps, key=lambda s: s.peak_open or 0))})")
    empty = [s for s in result.ordered() if sent_nothing(s)]
    if empty:
        unmeasured += (f" ({what} {', '.join(level_text(mode, s.level) for s in empty)} "
                       f"not measured: {nothing_sent_text(empty)})")
    if result.best is None:
        if not result.steps:
            return f"{head}: no level finished"
        measured = [s for s in result.steps if not not_counted(s, cfg.slo.target)]
        if not measured:
            why = [] if not gaps else [
                f"{what} {', '.join(level_text(mode, s.level) for s in gaps)}: "
                f"{unreached_text(max(gaps, key=lambda s: s.peak_open or 0))}"]
            if empty:
                why.append(f"{what} {', '.join(level_text(mode, s.level) for s in empty)} "
                           f"{nothing_sent_text(empty)}")
            return f"{head}: none measured — {'; '.join(why)}"
        lowest = min(measured, key=lambda s: s.level)
        return (f"{head}: none — {why_failed(lowest, mode, cfg.slo.target)}{note}"
                f"{unmeasured}")
    b = result.best
    lvl = f"{int(b.level)}" if mode == "concurrency" else f"{b.level:g} req/s"
    during = "" if interrupted == "between levels" else "during "
    if interrupted is not None and fail is None:
        tail = f" (interrupted {during}{interrupted}: the limit may be higher)"
    elif (fail is not None and interrupted is not None and interrupted_level is not None
          and b.level < interrupted_level < fail.level):
        tail = (f" (interrupted during {interrupted}, before the search settled: the limit "
                f"is at least {level_text(mode, b.level)} and below "
                f"{level_text(mode, fail.level)}){note}")
    elif fail is None:
        tail = " (no level failed: the limit may be higher)"
    else:
        tail = note
    return f"{head}: {lvl} → {b.goodput_tps:,.0f} tok/s goodput{tail}{unmeasured}"
