"""Safe, typed reading of a snapshot dict (the admin API's JSON).

The TUI treats every field as optional: a missing key, ``null``, a wrong type or a
non-finite number all read as ``None`` and render as "n/a". Widgets never index the
raw dict themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmtop.textsafe import printable


class FoldKey(str):
    """The type of :data:`FOLD_KEY`. A ``str`` (it travels wherever a user id does: the
    row-selected message, ``open_user``), but equal only to itself and hashed apart, so
    that no user id — every one a plain ``str``, whatever its characters — is taken for
    it, nor it for one."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FoldKey)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, FoldKey)

    def __hash__(self) -> int:
        return hash(FoldKey)

    def __repr__(self) -> str:
        return "FOLD_KEY"


FOLD_KEY = FoldKey("(others)")
"""What stands for the users row that folds every user past the top N where a user id
would (:meth:`SnapView.user`, the detail screen): not a name, so a user called "other",
"(others)" or "\\x00other" is never taken for it."""
WINDOWS: tuple[int | None, ...] = (10, 60, 300, None)
"""The windows ``w`` cycles through; ``None`` is the whole session ("all")."""


def as_num(x: object) -> float | None:
    """A finite number, else ``None`` (booleans are not numbers here)."""
    t = type(x)
    if t is float:
        return x if math.isfinite(x) else None  # type: ignore[arg-type,return-value]
    if t is int:
        return float(x)  # type: ignore[arg-type]
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def as_str(x: object) -> str | None:
    """A string as is; numbers as text; anything else ``None``."""
    if isinstance(x, str):
        return x
    if isinstance(x, int | float) and not isinstance(x, bool):
        return str(x)
    return None


def dig(d: object, *path: str) -> object:
    """``d[path[0]][path[1]]...`` or ``None`` as soon as a level is missing or not a dict."""
    cur = d
    for key in path:
        # JSON objects are dicts: the exact check is much cheaper than an ABC isinstance.
        if type(cur) is not dict and not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def dicts(x: object) -> list[Mapping[str, Any]]:
    """The dict items of a list; anything else gives an empty list."""
    if type(x) is not list and (not isinstance(x, Sequence) or isinstance(x, str | bytes)):
        return []
    return [i for i in x if type(i) is dict or isinstance(i, Mapping)]


def request_key(row: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """What identifies an active request across refreshes: its id, and the proxy it came
    through (``attach`` to several proxies labels each row with its proxy's URL; ids are
    only unique within one proxy)."""
    return as_str(row.get("proxy")), as_str(row.get("id"))


@dataclass(frozen=True, slots=True)
class Slo:
    """The SLOs the snapshot was computed against (all optional)."""

    ttft_s: float | None = None
    itl_p95_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    target: float | None = None

    def for_metric(self, metric: str) -> float | None:
        """The threshold a latency metric's cells are coloured against."""
        return {
            "ttft": self.ttft_s,
            "itl": self.itl_p95_s,
            "tpot": self.tpot_s,
            "e2e": self.e2e_s,
        }.get(metric)


class SnapView:
    """Read-only accessors over one snapshot; ``raw`` is the dict as received."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self.raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def num(self, *path: str) -> float | None:
        return as_num(dig(self.raw, *path))

    def text(self, *path: str) -> str | None:
        """A string field made safe for the terminal (:func:`printable`): the upstream URL,
        notes and names come from whoever runs the proxy, a recording or its clients."""
        s = as_str(dig(self.raw, *path))
        return None if s is None else printable(s)

    def mapping(self, *path: str) -> Mapping[str, Any]:
        v = dig(self.raw, *path)
        return v if isinstance(v, Mapping) else {}

    def items(self, *path: str) -> list[Mapping[str, Any]]:
        return dicts(dig(self.raw, *path))

    @property
    def time(self) -> float | None:
        """The snapshot's own clock (unix s): all "since"/"ago" figures are relative to it."""
        return self.num("time")

    @property
    def window_s(self) -> int | None:
        w = self.num("window_s")
        return None if w is None else int(w)

    @property
    def slo(self) -> Slo:
        d = self.mapping("slo")
        return Slo(
            ttft_s=as_num(d.get("ttft_s")),
            itl_p95_s=as_num(d.get("itl_p95_s")),
            tpot_s=as_num(d.get("tpot_s")),
            e2e_s=as_num(d.get("e2e_s")),
            target=as_num(d.get("target")),
        )

    @property
    def uptime_s(self) -> float | None:
        up = self.num("uptime_s")
        if up is not None:
            return up
        started, now = self.num("started_at"), self.time
        if started is None or now is None:
            return None
        return max(0.0, now - started)

    @property
    def recording_path(self) -> str | None:
        """The file being recorded to, ``""`` when recording without a known path, or
        ``None`` when not recording. Accepts ``null``, a bool, a status string, or an
        object with ``status``/``active``/``path``."""
        rec = self.raw.get("recording")
        if rec is None or rec is False:
            return None
        if rec is True:
            return ""
        if isinstance(rec, str):
            return None if rec.lower() in _NOT_RECORDING else ""
        if isinstance(rec, Mapping):
            active = rec.get("active")
            status = rec.get("status")
            if active is False:
                return None
            if isinstance(status, str) and status.lower() in _NOT_RECORDING:
                return None
            return printable(as_str(rec.get("path")) or "")
        return None

    @property
    def recording_failed(self) -> bool:
        """Whether the recording being made stopped writing (its status's ``error``: a
        full disk, a file size limit, the file deleted or moved). The proxy goes on and
        the admin API still says recording; the TUI must not show a plain REC."""
        rec = self.raw.get("recording")
        return isinstance(rec, Mapping) and bool(rec.get("error"))

    @property
    def recording_shared(self) -> bool:
        """Whether another live process was writing the recording's stem when it started
        (its status's ``others_writing``: two proxies given one ``--record``, a restart
        before the old process exited): the proxy's stderr says so at start, unseen under
        the TUI, and the two series sit side by side in one directory."""
        rec = self.raw.get("recording")
        return isinstance(rec, Mapping) and bool(rec.get("others_writing"))

    def user(self, name: str) -> Mapping[str, Any] | None:
        """The row of user ``name``; :data:`FOLD_KEY` names the row of every user past the
        top N (``tracked`` false, named "other" in the snapshot), so that a real user
        named "other" is never taken for it, nor it for them."""
        fold = isinstance(name, FoldKey)
        for u in self.items("users"):
            if (u.get("tracked") is False) is fold and (fold or as_str(u.get("user")) == name):
                return u
        return None


_NOT_RECORDING = frozenset({"", "off", "idle", "stopped", "none", "inactive", "disabled"})
