"""The report as plain text: conditions first, then the figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len

from llmtop.recording.report.fmt import (
    NA,
    PERCENTILE_NOTE,
    arrivals_text,
    attainment,
    before_start_note,
    capacity_text,
    carried,
    compact_all,
    dist,
    duration,
    few,
    file_notes,
    gib,
    header_rows,
    no_footer,
    num,
    offset,
    pct,
    pct100,
    requests_judged,
    secs,
    slo_text,
    user_name,
    warnings_shown,
    when,
)
from llmtop.textsafe import printable

LATENCY_ROWS = (("ttft", "TTFT"), ("itl", "ITL"), ("chunk_gap", "chunk gap"),
                ("tpot", "TPOT"), ("e2e", "E2E"))


def table(rows: Sequence[Sequence[str]], header: Sequence[str], indent: str = "  ",
          *, left: bool = False) -> list[str]:
    """Columns padded to width in terminal cells (a CJK name takes two a character):
    first column left-aligned, the rest right-aligned (all left-aligned with ``left``).
    Cells are made :func:`printable` first, so that a name's escapes are measured as
    shown."""
    cols = len(header)
    grid = [[printable(str(c)) for c in r] for r in [header, *rows]]
    widths = [max(cell_len(r[i]) for r in grid) for i in range(cols)]

    def pad(s: str, width: int, right: bool) -> str:
        fill = " " * (width - cell_len(s))
        return fill + s if right else s + fill

    def line(r: Sequence[str]) -> str:
        cells = [pad(r[i], widths[i], i > 0 and not left) for i in range(cols)]
        return (indent + "  ".join(cells)).rstrip()

    return [line(r) for r in grid]


def lines_text(lines: Sequence[str]) -> str:
    """``lines`` as the report's text, each line :func:`printable`: user and model names,
    paths, error and warning texts come from clients and upstreams, and none may send
    a control sequence (a window title, the clipboard, a cleared screen) to the terminal
    the report is read on."""
    return "\n".join(printable(line) for line in lines)


def latency_rows(lat: dict[str, Any]) -> list[list[str]]:
    out = []
    for key, label in LATENCY_ROWS:
        d = lat.get(key) or {}
        out.append([label, num(d.get("count"), 0), secs(d.get("p50")), secs(d.get("p90")),
                    secs(d.get("p95")), secs(d.get("p99")), secs(d.get("max"))])
    return out


LATENCY_HEADER = ("", "samples", "p50", "p90", "p95", "p99", "max")

SLOWEST_HEADER = ("start (UTC)", "user", "model", "outcome", "status", "TTFT", "E2E",
                  "out tok", "id", "upstream id")
SLOWEST_LISTS = (("ttft", "by TTFT"), ("e2e", "by E2E"))


def slowest_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """A slowest list's rows as cells (plain text: the caller escapes for its medium);
    "-" where the engine named no id of its own."""
    return [[when(x["t_start"]).removesuffix(" UTC"), str(x["user"]), x["model"] or NA,
             x["outcome"], str(x["status"]), secs(x["ttft_s"]), secs(x["e2e_s"]),
             num(x["output_tokens"], 0), x["id"], x["upstream_id"] or "-"] for x in rows]


def slowest_none(r: dict[str, Any], key: str) -> str:
    """What an empty slowest list says."""
    if not r["conditions"]["requests"]:
        return "none (no requests in the recording)"
    return "none (no request had a first token)" if key == "ttft" else "none"


def slowest_lines(r: dict[str, Any]) -> list[str]:
    """The SLOWEST REQUESTS section (none with ``--slowest 0``)."""
    s = r.get("slowest") or {}
    if not s.get("k"):
        return []
    out = ["SLOWEST REQUESTS (llmtop's id; upstream id: the engine's, for its logs)"]
    for key, label in SLOWEST_LISTS:
        rows = s.get(key) or []
        if not rows:
            out.append(f"  {label}: {slowest_none(r, key)}")
            continue
        out.append(f"  {label}:")
        out += table(slowest_rows(rows), SLOWEST_HEADER, "    ", left=True)
    return out


def conditions_lines(r: dict[str, Any]) -> list[str]:
    c = r["conditions"]
    src = r["source"]
    models = few(f"{m} ({n})" for m, n in c["models"].items())
    arr = c["arrival"]
    conc = c["concurrency_at_start"]
    infl = c["in_flight"]
    lines = [
        f"  upstream        {c['upstream'] or NA}",
        f"  models          {models}",
        f"  SLOs            {slo_text(c['slo'])}",
        f"  recorded        {when(c['started_at'])} for {duration(c['duration_s'])}"
        + ("" if src["complete"] else f"  ({no_footer(src)})"),
        f"  requests        {num(c['requests'], 0)}"
        + (f" ({pct(c['streaming_share'])} streaming)" if c["streaming_share"] is not None
           else ""),
        f"  input tokens    {dist(c['prompt_tokens'])}",
        f"  output tokens   {dist(c['completion_tokens'])}"
        + (f"  [counted from: {', '.join(f'{k} {v}' for k, v in c['token_source'].items())}]"
           if c["token_source"] else ""),
        f"  concurrency     at start {num(conc.get('min'), 0)}–{num(conc.get('max'), 0)}"
        f" (p50 {num(conc.get('p50'), 0)}); in flight mean {num(infl.get('mean'))},"
        f" max {num(infl.get('max'), 0)}",
        f"  arrivals        {arrivals_text(arr)}",
    ]
    if c["gpus"]:
        lines.append(f"  GPUs            {'; '.join(c['gpus'])}")
    if c["engine_kind"]:
        lines.append(f"  engine          {c['engine_kind']}")
    for k, v in header_rows(c.get("extra")):
        lines.append(f"  {k:<15} {v}")
    for i, note in enumerate(file_notes(src)):
        lines.append(f"  {'file' if i == 0 else '':<15} {note}")
    if (early := before_start_note(c)) is not None:
        lines.append(f"  {'note':<15} {early}")
    return lines


def render_text(r: dict[str, Any]) -> str:
    """The whole report as text (ends with a newline); every name and message in it
    compact (:func:`~llmtop.recording.report.fmt.compact_all`)."""
    r = compact_all(r)
    out: list[str] = [f"llmtop report — {r['source']['file']}", ""]
    target = r["slo"].get("target")  # (shares below it never read as it: fmt.attainment)
    out += ["CONDITIONS", *conditions_lines(r), ""]

    out += ["LATENCY (as the client saw it, at the proxy)"]
    out += table(latency_rows(r["latency"]), LATENCY_HEADER)
    out.append(f"  ({PERCENTILE_NOTE})")
    out.append("")

    th = r["throughput"]
    out += [
        "THROUGHPUT",
        f"  system output   {num(th['output_tps'])} tok/s mean, "
        f"{num(th['output_tps_peak'])} tok/s peak ({th['series_window_s']} s windows)",
        f"  system input    {num(th['input_tps'])} tok/s",
        f"  requests        {num(th['rps'], 2)} req/s",
        f"  over            {duration(th.get('span_s'))}, the recording's start to its last "
        "event (every rate here, per user and goodput too)",
        "",
    ]

    users = r["users"]
    if users:
        out.append("PER USER (output tok/s over the session)")
        rows = [[user_name(u), num(u["requests"], 0), num(u["output_tps"]),
                 secs(u.get("ttft_p95")), secs(u.get("itl_p95")),
                 attainment(u.get("slo_attainment"), target),
                 num(u.get("errors", 0) + u.get("timeouts", 0), 0)]
                for u in users[:25]]
        out += table(rows, ("user", "requests", "tok/s", "TTFT p95", "ITL p95", "SLO met",
                            "err+tmo"))
        if len(users) > 25:
            out.append(f"  … and {len(users) - 25} more")
        out.append("")

    slowest = slowest_lines(r)
    out += [*slowest, ""] if slowest else []

    o = r["outcomes"]
    out += [
        "ERRORS AND TIMEOUTS",
        f"  ok {num(o['ok'], 0)} · errors {num(o['errors'], 0)} ({pct(o['error_rate'])}) · "
        f"timeouts {num(o['timeouts'], 0)} ({pct(o['timeout_rate'])}) · "
        f"cancelled {num(o['cancelled'], 0)}",
    ]
    for e in o["top_errors"]:
        out.append(f"  {e['count']:>6} × {e['error']}")
    if o.get("other_errors"):
        out.append(f"  {o['other_errors']:>6} × other errors")
    out.append("")

    s = r["slo"]
    out += [
        "SLO AND GOODPUT",
        f"  objectives      {slo_text(r['conditions']['slo'])}",
        f"  attainment      {attainment(s['attainment'], s.get('target'))}"
        + ("" if s["target_met"] is None else
           ("  (meets the target)" if s["target_met"] else "  (BELOW the target)")),
        f"  goodput         {num(s['goodput_rps'], 2)} req/s, {num(s['goodput_tps'])} tok/s",
        "",
    ]

    out.append("CAPACITY AT SLO (requests binned by concurrency at their start)")
    out.append(f"  {capacity_text(r['capacity'], r['by_concurrency'])}")
    bc = [b for b in r["by_concurrency"] if b["requests"]]
    if bc:
        step = max(1, len(bc) // 20)
        shown = bc[::step]
        if bc[-1] is not shown[-1]:
            shown.append(bc[-1])
        rows = [[str(b["concurrency"]), requests_judged(b), secs(b["ttft_p95"]),
                 secs(b["itl_p95"]), num(b["output_tps"]),
                 attainment(b["slo_attainment"], target)]
                for b in shown]
        out += table(rows, ("concurrency", "requests", "TTFT p95", "ITL p95", "tok/s",
                            "SLO met"))
    out.append("")

    begin = r["conditions"]["started_at"]
    out.append("WARNINGS")
    if not r["warnings"]:
        out.append("  none fired")
    shown, more = warnings_shown(r["warnings"])
    for w in shown:
        span = (f"cleared {offset(w['cleared_at'], begin)} after {duration(w['duration_s'])}"
                if w["cleared_at"] is not None else "still raised at the end")
        sev = w["severity"] + (f" from {offset(w['escalated_at'], begin)}"
                               if w.get("escalated_at") is not None else "")
        out.append(f"  {offset(w['raised_at'], begin)}  {w['code']} ({sev}): "
                   f"{w['message']}{carried(w)} — {span}")
    if more is not None:
        out.append(f"  {more}")
    out.append("")

    out.append("GPU (peaks)")
    if not r["gpus"]:
        out.append("  no GPU readings in the recording")
    for g in r["gpus"]:
        total = g.get("mem_total_bytes")
        used = g.get("mem_used_peak_bytes")
        share = f" ({pct(used / total)})" if isinstance(used, int | float) and total else ""
        out.append(
            f"  GPU {g['index']} {g['name']}{' (simulated)' if g['simulated'] else ''}: "
            f"memory {gib(used)} of {gib(total)}{share} at "
            f"{offset(g.get('mem_used_peak_at'), begin)}; DRAM bandwidth "
            f"{pct100(g.get('dram_bw_util_peak'))} of peak; memory busy "
            f"{pct100(g.get('mem_busy_peak'))}; GPU util {pct100(g.get('util_gpu_peak'))}; "
            f"power {num(g.get('power_w_peak'), 0)} W"
        )
    e = r["engine"]
    if e.get("kind"):
        out.append(f"  engine ({e['kind']}): running max {num(e.get('running_max'), 0)}, "
                   f"waiting max {num(e.get('waiting_max'), 0)}, KV cache max "
                   f"{pct(e.get('kv_cache_usage_max'))}")
    out.append("")
    return lines_text(out)
