"""The ``/metrics`` exposition written straight from llmtop's families, without
prometheus_client's per-sample objects.

prometheus_client's encoders turn every sample (a ``Sample`` with a label dict) into a
line with a sort, a validation regex and an escape per label, per sample: at 1,000 users
(~57,000 lines, 45 of 46 the per-user histograms and counters) that was ~200 ms for the
text format and ~400 ms for OpenMetrics, on the admin thread, holding the GIL beside the
proxy's forwarding loop. Here the families are columns (:class:`Family`: rows of label
values; :class:`Histograms`: cumulative counts per series) and each line is one string
concatenation: a label value is escaped once per scrape, a count formatted once per
distinct value, the ``le`` prefixes once per family.

The bytes are prometheus_client's own for the same families (``tests/metrics`` compares
them for the ``underscores`` and ``allow-utf-8`` escapings): the same line order, labels
sorted by name, label values escaped (``\\``, newline, ``"``), values as
``floatToGoString``; HELP escaped as each format does. Names are written as they are:
every escaping scheme leaves a name of the legacy character set (every llmtop name)
unchanged, as prometheus/common's ``EscapeMetricFamily`` does, so the answer is the same
under ``dots`` and ``values`` too (prometheus_client escaped each sample name whole there,
suffix included: ``U__llmtop__requests__total`` under ``# TYPE llmtop_requests``,
``llmtop__ttft__seconds__bucket`` under ``# TYPE llmtop__ttft__seconds``, so no sample
belonged to its family and the OpenMetrics parser refused the scrape). A name outside that
set goes to prometheus_client's encoder with the equivalent ``Metric`` objects
(:func:`to_metrics`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.openmetrics import exposition as om
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString as _untyped_go

floatToGoString: Callable[[float], str] = _untyped_go
"""prometheus_client's value formatting (untyped there)."""

Kind = Literal["counter", "gauge", "histogram"]
Format = Literal["text", "openmetrics"]

_LEGACY_NAME: re.Pattern[str] = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
"""Names both formats write unchanged under every escaping scheme (no ``:``: prometheus_client
escapes OpenMetrics sample names by the label-name rune set)."""


@dataclass(slots=True)
class Histograms:
    """Histogram series of one family, as columns: the series' label values (one label,
    ``label``; none for the system-wide one), the ``le`` bounds (``+Inf`` not included),
    each series' cumulative counts at those bounds, its total (the ``+Inf`` bucket and
    ``_count``) and its sum."""

    label: str | None
    values: list[str]
    les: Sequence[str]
    cum: list[list[int]]
    totals: list[int]
    sums: list[float]


@dataclass(slots=True)
class Family:
    """One metric family: ``rows`` of ``(label values, value)`` in the order of
    ``labels`` (counters and gauges), or ``hist`` (histograms: their ``rows`` are not
    read)."""

    name: str
    kind: Kind
    doc: str
    labels: tuple[str, ...] = ()
    rows: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    hist: Histograms | None = None


def to_metrics(families: Sequence[Family]) -> list[Metric]:
    """prometheus_client's families for ``families`` (the samples ``add_metric`` would
    add), for registries and encoders other than :func:`encode`'s own."""
    out: list[Metric] = []
    for f in families:
        m: CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily
        if f.kind == "histogram":
            m = HistogramMetricFamily(f.name, f.doc, labels=f.labels)
        else:
            m = (CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily)(
                f.name, f.doc, labels=f.labels)
            for values, v in f.rows:
                m.add_metric(list(values), v)
        h = f.hist
        if h is not None:
            for i, total in enumerate(h.totals):
                labels = {} if h.label is None else {h.label: h.values[i]}
                buckets = [(le, float(c)) for le, c in zip(h.les, h.cum[i], strict=True)]
                buckets.append(("+Inf", float(total)))
                add_histogram(m, labels, buckets, h.sums[i])
        out.append(m)
    return out


def add_histogram(fam: Metric, labels: dict[str, str],
                  buckets: list[tuple[str, float]], total: float) -> None:
    """The samples ``HistogramMetricFamily.add_metric`` adds for one series (buckets,
    ``_count``, ``_sum``), at about half its cost."""
    name = fam.name
    bucket = name + "_bucket"
    fam.samples.extend([Sample(bucket, {**labels, "le": le}, v, None, None)
                        for le, v in buckets])
    fam.samples.append(Sample(name + "_count", dict(labels), buckets[-1][1], None, None))
    fam.samples.append(Sample(name + "_sum", dict(labels), total, None, None))


class _Families:
    """A collector over ready families (what prometheus_client's encoders read)."""

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return to_metrics(self.families)


_VERSION: re.Pattern[str] = re.compile(r"[0-9]+(?:\.[0-9]+)*\Z")


def _servable(accept: str) -> str:
    """``accept`` without the media ranges whose ``version`` is not a version number
    (ASCII digits and dots), which ``choose_encoder`` cannot weigh: it compared their
    parts with integers (``version=abc``, ``1.x``, a stray byte: ``TypeError``, a 500 and
    a traceback per scrape) or copied what ``int()`` reads (``\u0661.0.0``, ``1_0.0.0``)
    into the ``Content-Type``. Such a range is one llmtop cannot serve, as prometheus/common
    skips a version it does not know: the next one decides, else the text format."""
    if "version" not in accept:
        return accept
    kept = []
    for media in accept.split(","):
        for tok in media.split(";"):  # the version choose_encoder reads: the first one
            key, eq, value = tok.strip().partition("=")
            if eq and key == "version":
                if value and not _VERSION.match(value):
                    break
                kept.append(media)
                break
        else:
            kept.append(media)
    return ",".join(kept)


def encode(families: Sequence[Family], accept: str = "") -> tuple[bytes, str]:
    """The exposition of ``families`` in the format an ``Accept`` header asks for and its
    ``Content-Type`` (prometheus_client's ``choose_encoder(accept)``): for names of the
    legacy character set, the format's lines with names unchanged under every escaping
    scheme (prometheus_client's bytes for ``underscores`` and ``allow-utf-8``); for other
    names, that encoder's bytes."""
    encoder, content_type = choose_encoder(_servable(accept))
    fmt: Format | None = None
    func: Callable[..., bytes] = encoder
    if isinstance(encoder, partial):
        func = encoder.func
    if func is text_latest:
        fmt = "text"
    elif func is om.generate_latest:
        fmt = "openmetrics"
    # every escaping scheme (underscores, allow-utf-8, dots, values) leaves legacy names as
    # they are (prometheus/common's EscapeMetricFamily): only other names need the encoder
    if fmt is None or not all(
            _LEGACY_NAME.match(f.name) and all(_LEGACY_NAME.match(n) for n in f.labels)
            and (f.hist is None or f.hist.label is None or _LEGACY_NAME.match(f.hist.label))
            for f in families):
        return encoder(_Families(families)), content_type
    return render(families, fmt).encode("utf-8"), content_type


class _Counts(dict[int, str]):
    """Integer counts as ``floatToGoString`` writes them, each computed once, with the
    line's newline."""

    def __missing__(self, key: int) -> str:
        s = self[key] = floatToGoString(float(key)) + "\n"
        return s


def _go(v: float) -> str:
    """``floatToGoString(v)``: ``repr`` where that has its point within the first six
    characters (what it returns then), else computed by it (exponents, ±Inf, NaN)."""
    s = repr(float(v))
    if 0 < s.find(".") <= 6:
        return s
    return floatToGoString(v)


class _Escaped(dict[str, str]):
    """Label values escaped for the exposition, each once."""

    def __missing__(self, key: str) -> str:
        s = self[key] = key.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        return s


def render(families: Sequence[Family], fmt: Format) -> str:
    """The exposition text of ``families`` (names of the legacy character set: see
    :func:`encode`)."""
    counts, esc, go = _Counts(), _Escaped(), _go
    out: list[str] = []
    put = out.append
    for f in families:
        name = f.name
        if fmt == "text":
            head = name + "_total" if f.kind == "counter" else name
            doc = f.doc.replace("\\", r"\\").replace("\n", r"\n")
        else:
            head = name
            doc = esc[f.doc]
        put(f"# HELP {head} {doc}\n# TYPE {head} {f.kind}\n")
        sample = name + "_total" if f.kind == "counter" else name
        if f.rows and f.kind != "histogram":
            order = sorted(range(len(f.labels)), key=f.labels.__getitem__)
            keys = [f.labels[j] + '="' for j in order]
            if not keys:
                for _, v in f.rows:
                    put(f"{sample} {go(v)}\n")
            elif len(keys) == 1:
                pre = sample + "{" + keys[0]
                for values, v in f.rows:
                    put(f'{pre}{esc[values[0]]}"}} {go(v)}\n')
            else:
                for values, v in f.rows:
                    labels = '",'.join([k + esc[values[j]] for k, j in zip(keys, order,
                                                                            strict=True)])
                    put(f'{sample}{{{labels}"}} {go(v)}\n')
        if f.hist is not None:
            _histograms(f.name, f.hist, put, counts, go, esc)
    if fmt == "openmetrics":
        put("# EOF\n")
    return "".join(out)


def _histograms(name: str, h: Histograms, put: Callable[[str], object], counts: _Counts,
                go: Callable[[float], str], esc: _Escaped) -> None:
    les = [*h.les, "+Inf"]
    bucket, count, total_sum = name + "_bucket", name + "_count", name + "_sum"
    if h.label is None:
        prefixes = [f'{bucket}{{le="{le}"}} ' for le in les]
        for row, total, sm in zip(h.cum, h.totals, h.sums, strict=True):
            put("".join([p + counts[c] for p, c in zip(prefixes, [*row, total], strict=True)]))
            put(f"{count} {counts[total]}{total_sum} {go(sm)}\n")
        return
    # a line is prefix + middle + count: labels sorted by name, "le" goes before or after
    # the series' label
    key = h.label + '="'
    if h.label > "le":
        prefixes = [f'{bucket}{{le="{le}",{key}' for le in les]
        middles = ['"} '] * len(les)
    else:
        prefixes = [f"{bucket}{{{key}"] * len(les)
        middles = [f'",le="{le}"}} ' for le in les]
    same = len(set(middles)) == 1
    for value, row, total, sm in zip(h.values, h.cum, h.totals, h.sums, strict=True):
        v = esc[value]
        if same:
            mid = v + middles[0]
            put("".join([p + mid + counts[c] for p, c in zip(prefixes, [*row, total],
                                                              strict=True)]))
        else:
            put("".join([p + v + m + counts[c] for p, m, c in zip(prefixes, middles,
                                                                  [*row, total], strict=True)]))
        put(f'{count}{{{key}{v}"}} {counts[total]}{total_sum}{{{key}{v}"}} {go(sm)}\n')
