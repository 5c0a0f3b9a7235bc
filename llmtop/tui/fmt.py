"""Formatting of snapshot values for the screen. Every function accepts ``None`` and
returns ``"n/a"`` for it: a missing reading is a value, never a crash."""

from __future__ import annotations

import math
import re

from rich.cells import cell_len, get_character_cell_size

from llmtop.textsafe import printable

NA = "n/a"


def clip(s: str, n: int) -> str:
    """``s`` in at most ``n`` terminal cells, cut with "…" when wider. Cells, not
    characters: "日本語" takes 6, and is cut before a wide character that would not fit
    whole (so the "…" always shows)."""
    if n <= 0:
        return ""
    if cell_len(s) <= n:
        return s
    used, end = 0, 0
    for i, ch in enumerate(s):
        w = get_character_cell_size(ch)
        if used + w > n - 1:
            break
        used, end = used + w, i + 1
    return s[:end] + "…"


def name(s: str, n: int, empty: str = "(empty)") -> str:
    """A client-chosen string (user id, model, request id) as shown in ``n`` cells: its
    control characters made visible and bidi overrides dropped
    (:func:`llmtop.textsafe.printable`), ``empty`` when there is nothing to show, then
    :func:`clip`. Put it in a ``Text``, never in markup."""
    return clip(printable(s) or empty, n)


def _tail(s: str, n: int) -> str:
    """The end of ``s`` in at most ``n`` cells (whole characters)."""
    used, start = 0, len(s)
    for i in range(len(s) - 1, -1, -1):
        w = get_character_cell_size(s[i])
        if used + w > n:
            break
        used, start = used + w, i
    return s[start:]


def names(items: list[str], n: int, empty: str = "(empty)") -> list[str]:
    """:func:`name` for each of ``items``, shown together (a table's column): where
    different names would be cut to the same label ("svc-eu-west-1-work…" for worker-017
    and worker-018), those are cut in the middle instead, keeping as much of their ends
    as tells them apart ("svc-eu-west-…ker-017")."""
    shown = [name(s, n, empty) for s in items]
    groups: dict[str, set[str]] = {}
    for s, label in zip(items, shown, strict=True):
        groups.setdefault(label, set()).add(printable(s) or empty)
    for label, group in groups.items():
        if len(group) < 2 or n < 3:
            continue
        # the end kept: at least the last "-"/"_"/"."-separated part ("017", not "7")
        # when it takes no more than half, more when that is not enough to tell apart
        last = max(cell_len(re.split(r"[-_./:@ ]", g)[-1]) for g in group)
        fixed: dict[str, str] = {}
        for tail in range(last if 0 < last <= n // 2 else 1, n - 1):
            fixed = {g: g if cell_len(g) <= n else
                     clip(g, n - tail)[:-1] + "…" + _tail(g, tail) for g in group}
            if len(set(fixed.values())) == len(group):
                break
        shown = [fixed.get(printable(s) or empty, x) if x == label else x
                 for s, x in zip(items, shown, strict=True)]
    return shown


def latency(s: float | None) -> str:
    """A duration in seconds as the most readable unit: ``850 µs``, ``12.3 ms``, ``1.24 s``.
    The unit is chosen by the value as shown: 0.9996 s is ``1.00 s``, not ``1000 ms``."""
    if s is None or not math.isfinite(s):
        return NA
    a = abs(s)
    if a == 0:
        return "0 ms"
    if round(a * 1e6) < 1:
        return "<1 µs"  # not "0 µs": it did take time
    if round(a * 1e6) < 1000:
        return f"{s * 1e6:.0f} µs"
    if round(a * 1e3, 2) < 10:
        return f"{s * 1e3:.2f} ms"
    if round(a * 1e3, 1) < 100:
        return f"{s * 1e3:.1f} ms"
    if round(a * 1e3) < 1000:
        return f"{s * 1e3:.0f} ms"
    if round(a, 2) < 10:
        return f"{s:.2f} s"
    if round(a, 1) < 100:
        return f"{s:.1f} s"
    return duration(s)


def latency_against(s: float | None, limit: float | None) -> str:
    """:func:`latency` for a value shown in the colours of ``limit`` (an SLO): one over the
    limit never reads as the limit itself. 500.4 ms against 500 ms was "500 ms" in the
    colour of a miss, beside an SLO of "500 ms"; it is ">500 ms"."""
    text = latency(s)
    if (s is None or limit is None or not math.isfinite(s) or s <= limit
            or text != latency(limit)):
        return text
    return ">" + text


def rate(x: float | None) -> str:
    """A rate (tokens/s, requests/s): three significant figures, thousands separated
    (the figures as shown: 9.996 is ``10.0``, not ``10.00``)."""
    if x is None or not math.isfinite(x):
        return NA
    a = abs(x)
    if round(a, 1) >= 100:
        return f"{x:,.0f}"
    if round(a, 2) >= 10:
        return f"{x:.1f}"
    if a == 0:
        return "0"
    return f"{x:.2f}"


def count(x: float | None) -> str:
    """A count (requests, tokens): an integer with thousands separators."""
    if x is None or not math.isfinite(x):
        return NA
    return f"{round(x):,}"


def pct(x: float | None, *, fraction: bool = False) -> str:
    """A percentage. ``fraction=True`` when the value is 0–1 (KV cache, SLO attainment)."""
    if x is None or not math.isfinite(x):
        return NA
    v = x * 100.0 if fraction else x
    if v != 0 and round(abs(v), 1) < 10:
        return f"{v:.1f}%"
    return f"{v:.0f}%"


DEFAULT_TARGET = 0.95
"""The SLO attainment target when the snapshot names none (as the palette colours it)."""


def attainment(x: float | None, target: float | None) -> str:
    """An SLO attainment (0–1) as :func:`pct` writes it, except where a whole percentage
    would round it onto what it has not reached: its ``target`` (94.6 % is not "95%"
    beside "target 95%") or 100 % (99.96 % is not "100%"). It then keeps one decimal,
    rounded towards zero: "94.6%", "99.9%"."""
    text = pct(x, fraction=True)
    if x is None or text == NA:
        return text
    v = x * 100.0
    t = 100.0 * (DEFAULT_TARGET if target is None else target)
    shown = round(v)
    if (shown >= t > v) or (shown >= 100 > v):
        return f"{math.floor(round(v * 10, 6)) / 10:.1f}%"  # (0.949 * 1000 is 948.99…)
    return text


def size_bytes(b: float | None) -> str:
    """Bytes in binary units: ``71.2 GiB``."""
    if b is None or not math.isfinite(b):
        return NA
    v = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        whole = unit == "B" or round(abs(v), 1) >= 100
        if round(abs(v), 0 if whole else 1) < 1024 or unit == "TiB":  # as shown: no "1024 B"
            return f"{v:.0f} {unit}" if whole else f"{v:.1f} {unit}"
        v /= 1024
    return NA  # unreachable: the loop returns at TiB


def duration(s: float | None) -> str:
    """A long duration as ``42s``, ``3m05s``, ``1h02m``, ``2d03h``."""
    if s is None or not math.isfinite(s) or s < 0:
        return NA
    t = int(s)
    if t < 60:
        return f"{t}s"
    m, sec = divmod(t, 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def window(w: int | None) -> str:
    """A snapshot window: ``10 s``, ``60 s``, ``5 min``, ``all``."""
    if w is None:
        return "all"
    if w >= 60 and w % 60 == 0 and w > 60:
        return f"{w // 60} min"
    return f"{w} s"


def watts(w: float | None) -> str:
    """Power in watts."""
    if w is None or not math.isfinite(w):
        return NA
    return f"{w:.0f} W"
