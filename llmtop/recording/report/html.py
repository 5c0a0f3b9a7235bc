"""The report as one self-contained HTML page: inline CSS, inline SVG plots, no scripts, no
network. Every string that came from the recording (user names, models, error messages,
warning texts, header fields) is HTML-escaped."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from llmtop.recording.report.compare import condition_rows, figure_rows, shown
from llmtop.recording.report.fmt import (
    NA,
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
    thin_levels,
    user_name,
    warnings_shown,
    when,
)
from llmtop.recording.report.plots import PLOTS, compare_knee
from llmtop.recording.report.text import (
    LATENCY_HEADER,
    SLOWEST_HEADER,
    SLOWEST_LISTS,
    latency_rows,
    slowest_none,
    slowest_rows,
)
from llmtop.textsafe import printable

CSS = """
:root { --fg:#1d2230; --muted:#5b6275; --line:#d9dce3; --bad:#c0392b; --ok:#1e7b34;
        --bg:#fff; --head:#f3f4f7; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0 auto; max-width: 1100px;
       padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub { color: var(--muted); margin-bottom: 16px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right;
         vertical-align: top; }
th { background: var(--head); font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
table.kv td:first-child { color: var(--muted); white-space: nowrap; }
table.kv td { text-align: left; }
.bad { color: var(--bad); font-weight: 600; } .ok { color: var(--ok); font-weight: 600; }
.note { color: var(--muted); font-size: 13px; }
.warn { border-left: 4px solid var(--bad); background: #fdf2f1; padding: 8px 12px;
        margin: 8px 0; }
figure { margin: 10px 0 18px; } figure svg { max-width: 100%; height: auto; }
code { background: var(--head); padding: 0 3px; border-radius: 3px; }
"""


def esc(v: Any) -> str:
    """``v`` as HTML text: markup escaped, and control characters shown as ``\\xNN``
    with bidi overrides removed (:func:`~llmtop.textsafe.printable`), as the text report
    shows them: a user name or error text from a client or an upstream carrying an RLO
    drew the cells after it reversed, and an ESC or BEL went into the page as it was."""
    return html.escape("" if v is None else printable(str(v)), quote=True)


def kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def grid(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """A table; cells are escaped here (pass plain strings)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def figure(r: dict[str, Any], plot_id: str, caption: str) -> str:
    return (f'<figure data-plot="{plot_id}">{PLOTS[plot_id](r)}'
            f'<figcaption class="note">{esc(caption)}</figcaption></figure>')


def conditions_section(r: dict[str, Any]) -> str:
    c, src = r["conditions"], r["source"]
    arr, conc, infl = c["arrival"], c["concurrency_at_start"], c["in_flight"]
    rows: list[tuple[str, str]] = [
        ("upstream", esc(c["upstream"] or NA)),
        ("models", esc(few(f"{m} ({n})" for m, n in c["models"].items()))),
        ("SLOs", esc(slo_text(c["slo"]))),
        ("recorded", esc(f"{when(c['started_at'])}, {duration(c['duration_s'])}")
         + ("" if src["complete"] else
            f' <span class="bad">{esc(no_footer(src))}</span>')),
        ("requests", esc(num(c["requests"], 0))
         + (esc(f" ({pct(c['streaming_share'])} streaming)")
            if c["streaming_share"] is not None else "")),
        ("input tokens", esc(dist(c["prompt_tokens"]))),
        ("output tokens", esc(dist(c["completion_tokens"]))
         + esc(f" — counted from {', '.join(f'{k} ({v})' for k, v in c['token_source'].items())}"
               if c["token_source"] else "")),
        ("concurrency", esc(f"at start {num(conc.get('min'), 0)}–{num(conc.get('max'), 0)} "
                            f"(p50 {num(conc.get('p50'), 0)}); in flight mean "
                            f"{num(infl.get('mean'))}, max {num(infl.get('max'), 0)}")),
        ("arrivals", esc(arrivals_text(arr))),
    ]
    if c["gpus"]:
        rows.append(("GPUs", esc("; ".join(c["gpus"]))))
    if c["engine_kind"]:
        rows.append(("engine", esc(c["engine_kind"])))
    rows += [(k, esc(v)) for k, v in header_rows(c.get("extra"))]
    notes = file_notes(src)
    if notes:
        rows.append(("file", "<br>".join(esc(n) for n in notes)))
    if (early := before_start_note(c)) is not None:
        rows.append(("note", f'<span class="bad">{esc(early)}</span>'))
    return "<h2>Conditions</h2>" + kv_table(rows)


def slowest_section(r: dict[str, Any]) -> str:
    """The slowest requests (nothing with ``--slowest 0``)."""
    s = r.get("slowest") or {}
    if not s.get("k"):
        return ""
    parts = ["<h2>Slowest requests</h2>",
             '<p class="note">Each named by llmtop\'s id and the engine\'s own (upstream id), '
             "to look it up in the engine's logs; start times UTC.</p>"]
    for key, label in SLOWEST_LISTS:
        rows = s.get(key) or []
        label = label[0].upper() + label[1:]  # "By TTFT" (str.capitalize: "By ttft")
        if rows:
            parts.append(f"<h3>{esc(label)}</h3>")
            parts.append(grid(SLOWEST_HEADER, slowest_rows(rows), f"slowest-{key}"))
        else:
            parts.append(f'<p class="note">{esc(label)}: '
                         f"{esc(slowest_none(r, key))}.</p>")
    return "".join(parts)


def render_html(r: dict[str, Any]) -> str:
    """The complete page; every name and message in it compact
    (:func:`~llmtop.recording.report.fmt.compact_all`)."""
    r = compact_all(r)
    src = r["source"]
    begin = r["conditions"]["started_at"]
    target = r["slo"].get("target")  # (shares below it never read as it: fmt.attainment)
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>llmtop report — {esc(src['file'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>llmtop report — {esc(src['file'])}</h1>",
        f'<div class="sub">{esc(when(begin))} · {esc(r["conditions"]["upstream"] or NA)} · '
        f"llmtop {esc(r['conditions'].get('llmtop_version') or NA)}</div>",
        conditions_section(r),
    ]

    parts.append("<h2>Latency</h2>")
    parts.append('<p class="note">As the client saw it, measured at the proxy; percentiles '
                 "from HDR histograms (3 significant digits).</p>")
    parts.append(grid(LATENCY_HEADER, latency_rows(r["latency"]), "lat"))
    parts.append(figure(r, "plot-latency-time", "TTFT and ITL percentiles over time; the red "
                        "line is the SLO."))
    parts.append(figure(r, "plot-distributions", "Distributions over the whole session."))

    th = r["throughput"]
    parts.append("<h2>Throughput</h2>")
    parts.append(kv_table([
        ("system output", esc(f"{num(th['output_tps'])} tok/s mean, "
                              f"{num(th['output_tps_peak'])} tok/s peak "
                              f"({th['series_window_s']} s windows)")),
        ("system input", esc(f"{num(th['input_tps'])} tok/s")),
        ("requests", esc(f"{num(th['rps'], 2)} req/s")),
        ("over", esc(f"{duration(th.get('span_s'))}, the recording's start to its last event "
                     "(every rate here, per user and goodput too)")),
    ]))
    parts.append(figure(r, "plot-throughput-time", "System output tokens per second, goodput, "
                        "and requests in flight."))

    users = r["users"]
    parts.append("<h2>Per user</h2>")
    parts.append(grid(("user", "requests", "output tok/s", "TTFT p95", "ITL p95", "SLO met",
                       "errors", "timeouts"),
                      [[user_name(u), num(u["requests"], 0), num(u["output_tps"]),
                        secs(u.get("ttft_p95")), secs(u.get("itl_p95")),
                        attainment(u.get("slo_attainment"), target), num(u.get("errors"), 0),
                        num(u.get("timeouts"), 0)] for u in users]))
    parts.append(figure(r, "plot-users", "Output tokens per second and TTFT p95 per user."))

    if slowest := slowest_section(r):
        parts.append(slowest)

    o = r["outcomes"]
    parts.append("<h2>Errors and timeouts</h2>")
    parts.append(kv_table([
        ("ok", esc(num(o["ok"], 0))),
        ("errors", esc(f"{num(o['errors'], 0)} ({pct(o['error_rate'])})")),
        ("timeouts", esc(f"{num(o['timeouts'], 0)} ({pct(o['timeout_rate'])})")),
        ("cancelled by the client", esc(num(o["cancelled"], 0))),
        ("HTTP statuses", esc(", ".join(f"{k}: {v}" for k, v in o["statuses"].items()) or NA)),
    ]))
    if o["top_errors"]:
        parts.append(grid(("most frequent errors", "count"),
                          [[e["error"], num(e["count"], 0)] for e in o["top_errors"]]
                          + ([["other errors", num(o["other_errors"], 0)]]
                             if o.get("other_errors") else [])))

    s = r["slo"]
    verdict = "" if s["target_met"] is None else (
        ' <span class="ok">meets the target</span>' if s["target_met"]
        else ' <span class="bad">below the target</span>')
    parts.append("<h2>SLO attainment and goodput</h2>")
    parts.append(kv_table([
        ("objectives", esc(slo_text(r["conditions"]["slo"]))),
        ("attainment", esc(attainment(s["attainment"], s.get("target"))) + verdict),
        ("goodput", esc(f"{num(s['goodput_rps'], 2)} req/s, {num(s['goodput_tps'])} tok/s")),
    ]))

    cap = r["capacity"]
    parts.append("<h2>Capacity at SLO</h2>")
    if cap.get("max_concurrency_at_slo") is None and \
            cap.get("first_failing_concurrency") is not None:
        parts.append(f"<p>Below <b>{esc(cap['first_failing_concurrency'])}</b>: the SLOs "
                     f"fail there, and no lower level has "
                     f"{esc(cap.get('min_requests_per_bin'))} judged requests to say where "
                     "they hold.</p>")
    elif cap.get("max_concurrency_at_slo") is None:
        parts.append(f'<p class="note">Not enough data: each concurrency level needs '
                     f"{esc(cap.get('min_requests_per_bin'))} judged requests.</p>")
    elif cap.get("max_concurrency_at_slo") == 0:
        text = capacity_text(cap, r["by_concurrency"])
        head, _, rest = text.partition(" — ")
        parts.append(f'<p><b class="bad">{esc(head.capitalize())}</b> — {esc(rest)}.</p>')
    else:
        parts.append(f"<p>Largest concurrency meeting the SLOs ≈ "
                     f"<b>{esc(cap['max_concurrency_at_slo'])}</b>, goodput there ≈ "
                     f"<b>{esc(num(cap.get('goodput_tps_at_slo')))} tok/s</b>"
                     + (f"; first failing level {esc(cap['first_failing_concurrency'])}"
                        if cap.get("first_failing_concurrency") is not None else
                        "; no level failed: the limit may be higher")
                     + esc(thin_levels(cap["max_concurrency_at_slo"],
                                       cap.get("first_failing_concurrency"),
                                       cap.get("min_requests_per_bin"), r["by_concurrency"]))
                     + ".</p>")
    parts.append(figure(r, "plot-knee", "Each point is one concurrency level (requests in "
                        "flight when a request started). Past the knee, latency grows while "
                        "throughput stays flat."))
    bc = [b for b in r["by_concurrency"] if b["requests"]]
    if bc:
        parts.append(grid(("concurrency", "requests", "TTFT p50", "TTFT p95", "ITL p95",
                           "E2E p95", "tok/s", "SLO met"),
                          [[str(b["concurrency"]), requests_judged(b), secs(b["ttft_p50"]),
                            secs(b["ttft_p95"]), secs(b["itl_p95"]), secs(b["e2e_p95"]),
                            num(b["output_tps"]), attainment(b["slo_attainment"], target)]
                           for b in bc]))

    parts.append("<h2>Warnings</h2>")
    if not r["warnings"]:
        parts.append('<p class="note">No saturation warning fired.</p>')
    else:
        shown, more = warnings_shown(r["warnings"])
        parts.append(grid(("raised", "code", "severity", "message", "cleared", "lasted"),
                          [[offset(w["raised_at"], begin), w["code"],
                            w["severity"] + (f" from {offset(w['escalated_at'], begin)}"
                                             if w.get("escalated_at") is not None else ""),
                            w["message"] + carried(w), offset(w["cleared_at"], begin)
                            if w["cleared_at"] is not None else "still raised",
                            duration(w["duration_s"])] for w in shown]))
        if more is not None:
            parts.append(f'<p class="note">{esc(more)}</p>')

    parts.append("<h2>GPU and engine</h2>")
    if r["gpus"]:
        parts.append(grid(("GPU", "memory peak", "of total", "at", "DRAM bandwidth peak",
                           "memory busy peak", "GPU util peak", "power peak"),
                          [[f"{g['index']} {g['name']}" + (" (simulated)" if g["simulated"]
                                                           else ""),
                            gib(g.get("mem_used_peak_bytes")), gib(g.get("mem_total_bytes")),
                            offset(g.get("mem_used_peak_at"), begin),
                            pct100(g.get("dram_bw_util_peak")), pct100(g.get("mem_busy_peak")),
                            pct100(g.get("util_gpu_peak")),
                            f"{num(g.get('power_w_peak'), 0)} W"] for g in r["gpus"]]))
    e = r["engine"]
    if e.get("kind"):
        parts.append(f'<p>Engine <code>{esc(e["kind"])}</code>: running max '
                     f"{esc(num(e.get('running_max'), 0))}, waiting max "
                     f"{esc(num(e.get('waiting_max'), 0))}, KV cache max "
                     f"{esc(pct(e.get('kv_cache_usage_max')))}; engine's own TTFT p95 "
                     f"{esc(secs(e.get('ttft_p95')))}.</p>")
    parts.append(figure(r, "plot-gpu", "Memory used per GPU, and DRAM bandwidth (% of peak; "
                        "memory busy time where bandwidth is not available)."))
    parts.append(f'<p class="note">Generated by llmtop from {esc(src["file"])} '
                 f"({esc(num(src['events'], 0))} events).</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_compare_html(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Two recordings side by side; differing conditions in a warning box before any
    figure."""
    cmp, a, b = shown(a, b)
    title = f"llmtop comparison — {cmp['a']} vs {cmp['b']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<div class="sub">A: {esc(cmp["a"])} · B: {esc(cmp["b"])}</div>',
    ]
    if cmp["warnings"]:
        items = "".join(f"<li>{esc(w)}</li>" for w in cmp["warnings"])
        said = ("<b>The recordings are judged against different SLOs.</b> The B/A ratios of "
                "SLO attainment, goodput and capacity are withheld: they would compare "
                "different targets." if cmp["slo_only_differs"] else
                "<b>The recordings were made under different conditions.</b> The B/A ratios "
                "are withheld: they would compare different workloads.")
        parts.append(f'<div class="warn" id="condition-warnings">{said}<ul>{items}</ul></div>')
    if cmp["notes"]:
        parts.append('<ul class="note">' + "".join(f"<li>{esc(n)}</li>" for n in cmp["notes"])
                     + "</ul>")
    parts.append("<h2>Conditions</h2>")
    parts.append(grid(("", "A", "B"), condition_rows(a, b), "kv"))
    parts.append("<h2>Figures</h2>")
    parts.append(grid(("", "A", "B", "B/A"), figure_rows(cmp)))
    parts.append(f'<figure data-plot="plot-compare-knee">{compare_knee(a, b)}</figure>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
