"""Number formatting shared by the text and HTML reports ("n/a" for missing values)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, Final

from llmtop.textsafe import printable

NA = "n/a"
PERCENTILE_NOTE = ("percentiles and max from HDR histograms, as live: within 0.1% of a "
                   "recorded sample (3 significant digits), not interpolated")
"""How exact the latency figures are, said with them (text, comparison, JSON)."""
FOLD_LABEL = "(others)"
"""The per-user row of every user past the top N (``tracked`` false, named "other" in the
snapshot), as the TUI shows it: never taken for a user called "other"."""


MAX_SHOWN: Final = 240
"""The most characters of one string a text or HTML report shows. Names a proxy writes fit
(users are cut at 128, models at 200, errors at 300 with their "…"); a longer one (a GPU
name, a warning's message, a name in a recording made or edited elsewhere) is shortened by
:func:`compact`. The JSON report keeps every string whole."""


def compact(s: str, limit: int = MAX_SHOWN) -> str:
    """``s`` made :func:`~llmtop.textsafe.printable` and, when longer than ``limit``
    characters, cut to its start and end around "…" with its length said:
    ``GGGG…HHHH (5,014 characters)``. Both ends are kept (names that differ only at the
    end stay apart); idempotent."""
    s = printable(s)
    if len(s) <= limit:
        return s
    keep = max(limit - 24, 2)  # room for "… (1,234,567 characters)"
    head = keep * 2 // 3
    return f"{s[:head]}…{s[len(s) - (keep - head):]} ({len(s):,} characters)"


def compact_all(v: Any) -> Any:
    """``v`` (a report or comparison as data) with every string in it, keys too,
    :func:`compact`: what the text and HTML reports render, so that no name or message
    of any length is printed whole. Two keys alike once shortened keep their own names."""
    if isinstance(v, str):
        return compact(v)
    if isinstance(v, dict):
        out: dict[Any, Any] = {}
        for k, x in v.items():
            ck = compact(k) if isinstance(k, str) else k
            out[k if ck in out else ck] = compact_all(x)
        return out
    if isinstance(v, list | tuple):
        return type(v)(compact_all(x) for x in v)
    return v


def user_name(row: Any) -> str:
    """A per-user row's name as shown (``FOLD_LABEL`` for the fold)."""
    return FOLD_LABEL if row.get("tracked") is False else str(row["user"])


def secs(v: Any) -> str:
    """A latency: µs / ms / s with three significant figures. The unit is chosen by the
    value as rounded (0.9996 s read "1e+03 ms", 0.0009996 s "1000 µs")."""
    if not isinstance(v, int | float):
        return NA
    if v * 1e6 < 999.5:
        return f"{v * 1e6:.0f} µs"
    if v * 1e3 < 999.5:
        return f"{v * 1e3:.3g} ms"
    if v < 99.95:
        return f"{v:.3g} s"
    return f"{v:.0f} s"


def num(v: Any, digits: int = 1) -> str:
    if not isinstance(v, int | float):
        return NA
    if isinstance(v, int) or (float(v).is_integer() and abs(v) >= 1000):
        return f"{int(v):,}"
    return f"{v:,.{digits}f}"


def pct(v: Any) -> str:
    """A 0–1 fraction as a percentage."""
    return NA if not isinstance(v, int | float) else f"{100 * v:.1f}%"


def attainment(v: Any, target: Any) -> str:
    """An SLO attainment (0–1) as a percentage that never rounds onto what it is not: a
    share below ``target`` that would read as the target reads "<97.5%" (39 of 40 against
    97.51% read "97.5% (BELOW the target)" beside "target 97.5%"), and one below 1 that
    would read "100.0%" reads "<100.0%"."""
    shown = pct(v)
    if not isinstance(v, int | float):
        return shown
    if isinstance(target, int | float) and v < target and shown == pct(target):
        return f"<{shown}"
    if v < 1 and shown == pct(1.0):
        return f"<{shown}"
    return shown


def before_start_note(c: Any) -> str | None:
    """What a report says when requests began before the recording did (``conditions``'
    ``requests_before_start``): the rates run over the recording's span and count only
    what those requests streamed inside it; their latencies are in the figures whole."""
    n = c.get("requests_before_start") if isinstance(c, dict) else None
    if not isinstance(n, int) or n <= 0:
        return None
    first, started = c.get("first_start_at"), c.get("started_at")
    lead = (f", the first {duration(started - first)} before it"
            if isinstance(first, int | float) and isinstance(started, int | float) else "")
    return (f"{num(n, 0)} request{'s' if n != 1 else ''} began before the recording did"
            f"{lead} (started mid-traffic, or a rotated part read alone): the rates (tok/s, "
            "req/s, goodput) run from the recording's start and count only the tokens "
            "streamed after it (none of their prompts); their latencies and SLO verdicts "
            "count whole")


def pct100(v: Any) -> str:
    """A value already in percent (GPU utilisations)."""
    return NA if not isinstance(v, int | float) else f"{v:.0f}%"


def gib(v: Any) -> str:
    return NA if not isinstance(v, int | float) else f"{v / 2**30:.1f} GiB"


def duration(v: Any) -> str:
    if not isinstance(v, int | float):
        return NA
    s = round(v)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{v:.1f}s"


def when(t: Any) -> str:
    """Unix seconds → ``YYYY-MM-DD HH:MM:SS UTC``."""
    if not isinstance(t, int | float):
        return NA
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def offset(t: Any, begin: Any) -> str:
    """A moment as ``+MM:SS`` from the session start."""
    if not isinstance(t, int | float) or not isinstance(begin, int | float):
        return NA
    d = max(0.0, t - begin)
    m, s = divmod(int(d), 60)
    h, m = divmod(m, 60)
    return f"+{h}:{m:02d}:{s:02d}" if h else f"+{m:02d}:{s:02d}"


def carried(w: dict[str, Any]) -> str:
    """`` (raised 5m12s before this file began)`` for a warning a rotated part carried
    in still raised (its ``since``), else empty."""
    since, at = w.get("since"), w.get("raised_at")
    if not isinstance(since, int | float) or not isinstance(at, int | float) or since >= at:
        return ""
    return f" (raised {duration(at - since)} before this file began)"


def dist(d: Any) -> str:
    """A token-length distribution: ``p50 100 · p90 112 · p99 123 (68–134)``."""
    if not isinstance(d, dict) or not d.get("count"):
        return NA
    return (f"p50 {num(d['p50'])} · p90 {num(d['p90'])} · p99 {num(d['p99'])} "
            f"(min {num(d['min'])}, max {num(d['max'])}, mean {num(d['mean'])})")


def slo_text(slo: Any) -> str:
    if not isinstance(slo, dict):
        return NA
    parts = []
    names = {"ttft_s": "TTFT", "itl_p95_s": "ITL p95 per request", "tpot_s": "TPOT",
             "e2e_s": "E2E"}
    for k, label in names.items():
        if isinstance(slo.get(k), int | float):
            parts.append(f"{label} ≤ {secs(slo[k])}")
    objectives = " and ".join(parts) if parts else "none configured (ok = no error)"
    target = slo.get("target")
    return objectives + (f"; target {pct(target)} of requests" if target is not None else "")


def requests_judged(row: Any) -> str:
    """A concurrency level's requests, with how many were judged on the SLOs when that
    differs (a request cancelled while within every objective is not): ``20 (19 judged)``
    — its "SLO met" share is over the judged ones."""
    if not isinstance(row, dict):
        return NA
    n, judged = row.get("requests"), row.get("judged")
    if isinstance(judged, int) and judged != n:
        return f"{num(n, 0)} ({num(judged, 0)} judged)"
    return num(n, 0)


def capacity_text(cap: Any, by_concurrency: Any) -> str:
    """The capacity estimate in words (no markup): the largest concurrency meeting the
    SLOs and the goodput there, or why there is none. ``max_concurrency_at_slo`` 0 means
    the lowest level seen already misses the target: said as "none — even concurrency 1
    misses the SLOs (...)", as ``llmtop bench`` says it, not "≈ 0"."""
    if not isinstance(cap, dict):
        return NA
    best, fail = cap.get("max_concurrency_at_slo"), cap.get("first_failing_concurrency")
    need = cap.get("min_requests_per_bin")
    if best is None and fail is not None:
        return (f"below {fail}: the SLOs fail there, and no lower level has {need} judged "
                "requests to say where they hold")
    if best is None:
        return f"not enough data: needs {need} judged requests at a concurrency level"
    if best == 0:
        row = next((b for b in by_concurrency or () if isinstance(b, dict)
                    and b.get("concurrency") == fail), None)
        why = ""
        if row is not None and row.get("slo_attainment") is not None:
            judged = row.get("judged", row.get("requests"))
            share = attainment(row["slo_attainment"], cap.get("target"))
            why = (f" (met by {share} of its {num(judged, 0)} judged "
                   f"requests; target {pct(cap.get('target'))})")
        return f"none — even concurrency {fail}, the lowest level seen, misses the SLOs{why}"
    return (f"max concurrency meeting the SLOs ≈ {best}, goodput there ≈ "
            f"{num(cap.get('goodput_tps_at_slo'))} tok/s"
            + (f"; first failing level {fail}" if fail is not None else
               "; no level failed: the limit may be higher")
            + thin_levels(best, fail, need, by_concurrency))


def thin_levels(best: int, fail: Any, need: Any, by_concurrency: Any) -> str:
    """The levels above ``best`` (and below ``fail``) the estimate could not count, as a
    clause: they had fewer than ``need`` judged requests (QA: "≈ 4" beside levels up to
    16 that all met the SLOs, with nothing saying why those were left out)."""
    if not isinstance(need, int) or not isinstance(by_concurrency, list | tuple):
        return ""
    thin: list[int] = []
    for b in by_concurrency:
        if not isinstance(b, dict):
            continue
        level, judged = b.get("concurrency"), b.get("judged", b.get("requests"))
        if (isinstance(level, int) and isinstance(judged, int) and level > best
                and (not isinstance(fail, int) or level < fail) and judged < need):
            thin.append(level)
    thin.sort()
    if not thin:
        return ""
    if len(thin) == 1:
        levels = f"level {thin[0]}"
    elif len(thin) <= 4:
        levels = f"levels {', '.join(map(str, thin[:-1]))} and {thin[-1]}"
    else:
        levels = f"{len(thin)} levels from {thin[0]} to {thin[-1]}"
    return f" ({levels}: fewer than {need} judged requests each, too few to count)"


def _n(k: int, one: str, many: str) -> str:
    return f"{k:,} {one if k == 1 else many}"


def no_footer(src: Any) -> str:
    """Why a recording read has no footer, in words."""
    if isinstance(src, dict) and src.get("gzip_damage"):
        return "no footer read: the compressed data is damaged"
    return "no footer: the recorder was killed or is still running"


def file_notes(src: Any) -> list[str]:
    """What the reader skipped or read with defaults, as sentences: damaged compressed data
    (where, and how much is unread), a summary line, then the first few lines' reasons
    (``line N: ...``). Empty when the file read cleanly."""
    if not isinstance(src, dict):
        return []
    damage = [str(src["gzip_damage"])] if src.get("gzip_damage") else []
    parts = []
    for key, one, many in (
        ("truncated_lines", "cut-off last line", "cut-off last lines"),
        ("bad_lines", "bad line skipped", "bad lines skipped"),
        ("unknown_lines", "line of an unknown type skipped", "lines of unknown types skipped"),
        ("defaulted_lines", "request with missing fields (defaults used)",
         "requests with missing fields (defaults used)"),
        ("dropped_by_recorder", "event dropped by the recorder",
         "events dropped by the recorder"),
        ("out_of_order_lines", "line out of time order (written after a later one)",
         "lines out of time order (written after a later one)"),
    ):
        k = src.get(key)
        if isinstance(k, int) and k > 0:
            parts.append(_n(k, one, many))
    out = ["; ".join(parts)] if parts else []
    if (n := open_at_stop_note(src.get("open_at_stop"))) is not None:
        out.append(n)
    return damage + out + [str(p) for p in src.get("problems") or []]


def open_at_stop_note(k: Any) -> str | None:
    """What a footer's ``open_at_stop`` means, in words (None when there were none, or
    the count is not known): those requests' records are not in the recording."""
    if type(k) is not int or k <= 0:
        return None
    return (f"{_n(k, 'request was', 'requests were')} still open when the recording "
            "stopped; they are not in it" if k != 1 else
            "1 request was still open when the recording stopped; it is not in it")


def arrivals_text(arr: Any) -> str:
    """``2.31 req/s mean, busiest 10 s 2.9 req/s, busiest second 8 req/s; dispersion 0.81
    (1 ≈ Poisson)``: the mean is over the same span as THROUGHPUT's requests/s."""
    if not isinstance(arr, dict) or arr.get("rps_mean") is None:
        return NA
    out = (f"{num(arr['rps_mean'], 2)} req/s mean, busiest 10 s "
           f"{num(arr.get('rps_peak_10s'), 2)} req/s, busiest second "
           f"{num(arr.get('rps_peak_1s'), 1)} req/s")
    if arr.get("dispersion_index") is not None:
        out += f"; dispersion {num(arr['dispersion_index'], 2)} (1 ≈ Poisson)"
    return out


MAX_LISTED: Final = 10
"""The most names (models, GPUs) a text or HTML report lists in one line of its
conditions; the rest are counted ("… and 1,990 more")."""


def few(names: Iterable[str], limit: int = MAX_LISTED) -> str:
    """``names`` joined with ", ", each :func:`compact`, the first ``limit`` of them and
    the number of the others: a client that puts a new model name in each request made
    one line of 30,000 characters of 2,000 models. ``NA`` for none."""
    items = list(names)
    shown = ", ".join(compact(n) for n in items[:limit])
    if len(items) > limit:
        shown += f", … and {len(items) - limit:,} more"
    return shown or NA


MAX_WARNINGS: Final = 50
"""The most warning episodes a text or HTML report lists, in time order."""


def warnings_shown(ws: list[dict[str, Any]],
                   limit: int = MAX_WARNINGS) -> tuple[list[dict[str, Any]], str | None]:
    """The warning episodes a report lists (the first ``limit``) and, when there are more,
    a line counting the others by code: a warning that flapped every few minutes of a
    week-long recording would otherwise be thousands of lines (the JSON has them all)."""
    if len(ws) <= limit:
        return ws, None
    rest: dict[str, int] = {}
    for w in ws[limit:]:
        rest[w["code"]] = rest.get(w["code"], 0) + 1
    by_code = few(f"{code} {n:,}" for code, n in sorted(rest.items(), key=lambda kv: -kv[1]))
    return ws[:limit], (f"… and {len(ws) - limit:,} more ({by_code}; --format json lists "
                        "them all)")


MAX_HEADER_FIELDS: Final = 20
"""The most header fields of its own a text or HTML report lists (a bench recording has
one, ``bench``; ``source`` and ``workers`` the others a recorder writes)."""


def header_rows(extra: Any) -> list[tuple[str, str]]:
    """A recording header's other fields as (name, value in words) rows: each value
    :func:`plain` then :func:`compact` (a bench header's 3,000 levels read as one line of
    17,000 characters), at most :data:`MAX_HEADER_FIELDS` of them and a last row saying
    how many more (the JSON report has them all)."""
    items = list((extra or {}).items())
    rows = [(compact(str(k)), compact(plain(v))) for k, v in items[:MAX_HEADER_FIELDS]]
    if len(items) > MAX_HEADER_FIELDS:
        more = len(items) - MAX_HEADER_FIELDS
        rows.append(("…", f"{more:,} more header field{'' if more == 1 else 's'} "
                          "(--format json lists them)"))
    return rows


def plain(v: Any, _depth: int = 0) -> str:
    """A header value in words, not Python's repr: an object as ``key value; key value``
    (nested ones in parentheses), a list as ``1, 2, 4``, null as n/a, booleans yes/no —
    ``mode concurrency; levels 1, 2, 4; workload (prompt_tokens 128, seed 0)``."""
    if isinstance(v, dict):
        sep = "; " if _depth == 0 else ", "
        body = sep.join(f"{k} {plain(x, _depth + 1)}" for k, x in v.items())
        return body if _depth == 0 else f"({body})"
    if isinstance(v, list | tuple):
        body = ", ".join(plain(x, _depth + 1) for x in v)
        return (body or "none") if _depth <= 1 else f"[{body}]"
    if v is None:
        return NA
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
