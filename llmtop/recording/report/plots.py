"""The report's plots: matplotlib (Agg), each returned as an inline ``<svg>`` string.

Every function takes the report dict and always returns a figure — with a short note in
place of the data when the recording has none (no GPU readings, no per-user traffic), so
the page's layout and the tests do not depend on what was recorded. Figures are built
without pyplot (no global state). Text stays text in the SVG (``svg.fonttype = none``) and
ids are salted per plot so several SVGs can share one HTML page. User-controlled labels
(user and model names) are escaped for mathtext.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from llmtop.recording.report.fmt import user_name
from llmtop.textsafe import printable

SLO_COLOR: Final = "#c0392b"
COLORS: Final = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


_METADATA: Final = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def _label(s: Any) -> str:
    """A user-controlled string safe for matplotlib: no mathtext, control characters shown
    as ``\\xNN`` and bidi overrides removed (:func:`~llmtop.textsafe.printable`: a raw
    ESC went into the SVG)."""
    return printable(str(s)).replace("$", r"\$")


MAX_LABEL: Final = 32
"""Longest name on a plot's axis: the proxy writes users up to 128 characters, and bars
labelled so squeezed the plot to nothing (matplotlib: 'axes sizes collapsed to zero')."""


def _short(s: str) -> str:
    """A name shortened to ``MAX_LABEL`` characters, its start and end kept (users often
    differ at the end: key:3f9a1c2e); the report's tables give it whole."""
    if len(s) <= MAX_LABEL:
        return s
    head = (MAX_LABEL - 1) * 2 // 3
    return s[:head] + "…" + s[len(s) - (MAX_LABEL - 1 - head):]


def _svg(fig: Figure, plot_id: str) -> str:
    """The figure as an inline SVG whose text stays text (the browser draws it in its own
    fonts). matplotlib's "Glyph N missing from font" warnings are dropped: it measures
    the text with its own font, which has no CJK, so a user named in Japanese printed one
    warning per character on stderr for a page that shows the name correctly."""
    buf = io.StringIO()
    with (matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": plot_id}),
          warnings.catch_warnings()):
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font",
                                category=UserWarning)
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    svg = text[start:] if start >= 0 else text
    svg = _METADATA.sub("", svg)  # the RDF block: namespace URLs and nothing useful
    return svg.replace("<svg ", f'<svg id="{plot_id}" role="img" ', 1)


def _fig(rows: int = 1, height: float = 3.4) -> tuple[Figure, Any]:
    fig = Figure(figsize=(9.5, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, squeeze=False)
    for ax in axes[:, 0]:
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes[:, 0]


def _empty(ax: Any, note: str) -> None:
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _ms(v: Any) -> float:
    return float(v) * 1e3 if isinstance(v, int | float) else math.nan


def _series(r: dict[str, Any], key: str, scale: Callable[[Any], float] = _ms) -> list[float]:
    return [scale(p.get(key)) for p in r["series"]]


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


def _minutes_axis(ts: Sequence[float]) -> tuple[list[float], str]:
    span = (max(ts) - min(ts)) if ts else 0.0
    if span > 2 * 3600:
        return [t / 3600 for t in ts], "hours since start"
    if span > 180:
        return [t / 60 for t in ts], "minutes since start"
    return list(ts), "seconds since start"


def latency_over_time(r: dict[str, Any]) -> str:
    """TTFT (p50/p95/p99) and ITL (p50/p95/p99) over time, with the SLO lines."""
    fig, (a1, a2) = _fig(2, 3.0)
    slo = r["conditions"]["slo"]
    t, xlabel = _minutes_axis([p["t"] for p in r["series"]])
    if not t:
        _empty(a1, "no requests in the recording")
        _empty(a2, "")
        return _svg(fig, "plot-latency-time")
    for ax, metric, name, slo_key in ((a1, "ttft", "TTFT", "ttft_s"),
                                      (a2, "itl", "ITL", "itl_p95_s")):
        for q, style in (("p50", ":"), ("p95", "-"), ("p99", "--")):
            ax.plot(t, _series(r, f"{metric}_{q}"), style, label=f"{name} {q}",
                    color=COLORS[0] if metric == "ttft" else COLORS[1])
        if isinstance(slo.get(slo_key), int | float):
            ax.axhline(_ms(slo[slo_key]), color=SLO_COLOR, lw=1.2,
                       label=f"SLO {name}{' p95/request' if metric == 'itl' else ''}")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8, ncols=4)
    th = r["throughput"]
    a1.set_title(f"Latency over time ({th['series_window_s']} s windows, "
                 f"every {th['series_step_s']} s)")
    a2.set_xlabel(xlabel)
    return _svg(fig, "plot-latency-time")


def throughput_over_time(r: dict[str, Any]) -> str:
    """System output tok/s and goodput, with requests in flight on a second axis."""
    fig, (ax,) = _fig(1, 3.6)
    t, xlabel = _minutes_axis([p["t"] for p in r["series"]])
    if not t:
        _empty(ax, "no requests in the recording")
        return _svg(fig, "plot-throughput-time")
    ax.plot(t, _series(r, "output_tps", _num), color=COLORS[2], label="system output tok/s")
    ax.plot(t, _series(r, "goodput_tps", _num), color=COLORS[2], ls="--", alpha=0.7,
            label="goodput tok/s")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    a2 = ax.twinx()
    a2.plot(t, _series(r, "in_flight_mean", _num), color=COLORS[3], label="in flight (mean)")
    a2.plot(t, _series(r, "waiting_mean", _num), color=COLORS[3], ls=":",
            label="waiting (mean)")
    a2.set_ylabel("requests in flight")
    a2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8, ncols=4)
    ax.set_title("System throughput and requests in flight")
    return _svg(fig, "plot-throughput-time")


def latency_vs_throughput(r: dict[str, Any]) -> str:
    """The central picture: per concurrency level, throughput (x) against TTFT and ITL
    p95 (y); the capacity at SLO (the knee) marked."""
    fig, (a1, a2) = _fig(2, 3.2)
    rows = [b for b in r["by_concurrency"]
            if b["requests"] and isinstance(b.get("output_tps"), int | float)]
    if not rows:
        _empty(a1, "no concurrency data (requests carry no concurrency_at_start)")
        _empty(a2, "")
        return _svg(fig, "plot-knee")
    cap = r["capacity"].get("max_concurrency_at_slo")
    slo = r["conditions"]["slo"]
    x = [b["output_tps"] for b in rows]
    for ax, key, name, slo_key, color in ((a1, "ttft_p95", "TTFT p95", "ttft_s", COLORS[0]),
                                          (a2, "itl_p95", "ITL p95", "itl_p95_s", COLORS[1])):
        y = [_ms(b.get(key)) for b in rows]
        ax.plot(x, y, "-o", color=color, ms=4, label=name)
        step = max(1, len(rows) // 12)
        for b, xi, yi in list(zip(rows, x, y, strict=True))[::step]:
            ax.annotate(str(b["concurrency"]), (xi, yi), textcoords="offset points",
                        xytext=(4, 4), fontsize=7, color="#444")
        if isinstance(slo.get(slo_key), int | float):
            ax.axhline(_ms(slo[slo_key]), color=SLO_COLOR, lw=1.2, label=f"SLO {name}")
        knee = [(xi, yi) for b, xi, yi in zip(rows, x, y, strict=True)
                if b["concurrency"] == cap]
        if knee:
            ax.plot(*knee[0], marker="*", ms=16, color=SLO_COLOR, ls="none",
                    label=f"capacity at SLO: concurrency {cap}")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8)
    a1.set_title("Latency vs throughput by concurrency (labels: requests in flight)")
    a2.set_xlabel("system output tok/s at that concurrency (Little's law)")
    return _svg(fig, "plot-knee")


def distributions(r: dict[str, Any]) -> str:
    """TTFT and ITL distributions (log-binned, log x), with p50/p95/p99 marked."""
    fig, axes = _fig(2, 2.8)
    for ax, metric, name in ((axes[0], "ttft", "TTFT"), (axes[1], "itl", "ITL")):
        d = r["distributions"].get(metric) or {}
        edges, counts = d.get("edges_s") or [], d.get("counts") or []
        if not counts:
            _empty(ax, f"no {name} samples")
            continue
        e_ms = [e * 1e3 for e in edges]
        ax.stairs(counts, e_ms, fill=True, alpha=0.6, color=COLORS[0 if metric == "ttft" else 1])
        ax.set_xscale("log")
        # plain tick labels: log axes default to mathtext (10^x), slow and needless here
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        lat = r["latency"].get(metric) or {}
        for q, style in (("p50", ":"), ("p95", "-"), ("p99", "--")):
            if isinstance(lat.get(q), int | float):
                ax.axvline(_ms(lat[q]), color="#333", ls=style, lw=1, label=f"{q}")
        ax.set_ylabel("samples")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_title("Latency distributions over the session")
    return _svg(fig, "plot-distributions")


def per_user(r: dict[str, Any]) -> str:
    """Output tok/s per user (bars), with TTFT p95 per user alongside."""
    users = [u for u in r["users"] if u.get("requests") or u.get("output_tps")][:20]
    fig = Figure(figsize=(9.5, max(2.4, 0.32 * len(users) + 1.2)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    if not users:
        _empty(axes[0], "no per-user traffic")
        _empty(axes[1], "")
        return _svg(fig, "plot-users")
    names = [_label(_short(printable(user_name(u)))) for u in users][::-1]
    tps = [_num(u.get("output_tps")) for u in users][::-1]
    ttft = [_ms(u.get("ttft_p95")) for u in users][::-1]
    # bars at positions, not at their names: two names alike once shortened stay apart
    pos = list(range(len(names)))
    axes[0].barh(pos, tps, color=COLORS[2])
    axes[0].set_yticks(pos, names)
    axes[0].set_xlabel("output tok/s (session mean)")
    axes[1].barh(pos, ttft, color=COLORS[0])
    axes[1].set_xlabel("TTFT p95 (ms)")
    slo = r["conditions"]["slo"].get("ttft_s")
    if isinstance(slo, int | float):
        axes[1].axvline(_ms(slo), color=SLO_COLOR, lw=1.2, label="SLO TTFT")
        axes[1].legend(fontsize=8, loc="lower right")
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_title("Per user")
    return _svg(fig, "plot-users")


def gpu_over_time(r: dict[str, Any]) -> str:
    """GPU memory used and DRAM bandwidth (or memory busy time) over time, per GPU."""
    fig, (a1, a2) = _fig(2, 2.8)
    gs = r.get("gpu_series") or {}
    if not gs:
        _empty(a1, "no GPU readings in this recording")
        _empty(a2, "")
        return _svg(fig, "plot-gpu")
    totals = {str(g["index"]): g.get("mem_total_bytes") for g in r["gpus"]}
    busy_only = True
    xlabel = "seconds since start"
    for n, (idx, s) in enumerate(sorted(gs.items())):
        t, xlabel = _minutes_axis(s["t"])
        color = COLORS[n % len(COLORS)]
        a1.plot(t, [_num(v) / 2**30 for v in s["mem_used_bytes"]], color=color,
                label=f"GPU {idx} used")
        tot = totals.get(idx)
        if isinstance(tot, int | float) and tot:
            a1.axhline(tot / 2**30, color=color, ls=":", lw=1, label=f"GPU {idx} total")
        bw = [_num(v) for v in s["dram_bw_util"]]
        if any(not math.isnan(v) for v in bw):
            busy_only = False
            a2.plot(t, bw, color=color, label=f"GPU {idx} DRAM bandwidth")
        else:
            a2.plot(t, [_num(v) for v in s["mem_busy"]], color=color, ls="--",
                    label=f"GPU {idx} memory busy (time, not bandwidth)")
    a1.set_ylabel("memory (GiB)")
    a1.set_ylim(bottom=0)
    a1.legend(loc="lower right", fontsize=8, ncols=2)
    a1.set_title("GPU memory and bandwidth")
    a2.set_ylabel("% of peak" if not busy_only else "% of time busy")
    a2.set_ylim(0, 105)
    a2.set_xlabel(xlabel)
    a2.legend(loc="lower right", fontsize=8, ncols=2)
    return _svg(fig, "plot-gpu")


def compare_knee(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Both recordings' latency-vs-throughput curves on one chart (TTFT p95)."""
    fig, (ax,) = _fig(1, 3.8)
    drawn = False
    for r, tag, color in ((a, "A", COLORS[0]), (b, "B", COLORS[1])):
        rows = [x for x in r["by_concurrency"]
                if x["requests"] and isinstance(x.get("output_tps"), int | float)]
        if not rows:
            continue
        drawn = True
        x = [row["output_tps"] for row in rows]
        y = [_ms(row.get("ttft_p95")) for row in rows]
        ax.plot(x, y, "-o", ms=4, color=color,
                label=f"{tag}: {_label(_short(printable(str(r['source']['file']))))}")
        cap = r["capacity"].get("max_concurrency_at_slo")
        for row, xi, yi in zip(rows, x, y, strict=True):
            if row["concurrency"] == cap:
                ax.plot(xi, yi, marker="*", ms=15, color=color, ls="none",
                        label=f"{tag} capacity at SLO: {cap}")
    if not drawn:
        _empty(ax, "no concurrency data in either recording")
        return _svg(fig, "plot-compare-knee")
    for r, ls in ((a, "-"), (b, "--")):
        slo = r["conditions"]["slo"].get("ttft_s")
        if isinstance(slo, int | float):
            ax.axhline(_ms(slo), color=SLO_COLOR, ls=ls, lw=1)
    ax.set_xlabel("system output tok/s at that concurrency (Little's law)")
    ax.set_ylabel("TTFT p95 (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Latency vs throughput: A and B")
    return _svg(fig, "plot-compare-knee")


PLOTS: Final[dict[str, Callable[[dict[str, Any]], str]]] = {
    "plot-latency-time": latency_over_time,
    "plot-throughput-time": throughput_over_time,
    "plot-knee": latency_vs_throughput,
    "plot-distributions": distributions,
    "plot-users": per_user,
    "plot-gpu": gpu_over_time,
}
"""Every plot of the HTML report by its element id."""
