"""Colours for values judged against targets, taken from the current Textual theme so
they stay readable when ``d`` switches between dark and light."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Palette:
    """Rich style strings: ``ok`` (meets target), ``warn`` (close), ``bad`` (misses),
    ``dim`` (n/a and labels), ``accent`` (headline figures)."""

    ok: str = "green"
    warn: str = "yellow"
    bad: str = "red"
    dim: str = "dim"
    accent: str = "cyan"

    @classmethod
    def from_variables(cls, v: Mapping[str, str], *, no_color: bool = False) -> Palette:
        """From Textual's CSS variables (``App.get_css_variables()``). With ``no_color``
        (``NO_COLOR`` set: Textual draws every colour as a grey) the judgements are told
        by attributes instead: over the target bold and underlined, close to it
        underlined, within it plain."""
        d = cls()
        if no_color:
            return cls(ok="", warn="underline", bad="bold underline", dim=d.dim,
                       accent="bold")
        return cls(
            ok=_solid(v.get("text-success") or v.get("success"), d.ok),
            warn=_solid(v.get("text-warning") or v.get("warning"), d.warn),
            bad=_solid(v.get("text-error") or v.get("error"), d.bad),
            dim=d.dim,
            accent=_solid(v.get("text-primary") or v.get("primary"), d.accent),
        )

    def latency(self, value: float | None, slo: float | None) -> str:
        """≤ 80% of the SLO: ok; up to the SLO: warn; over it: bad; no SLO: plain."""
        if value is None:
            return self.dim
        if slo is None or slo <= 0:
            return ""
        if value <= 0.8 * slo:
            return self.ok
        return self.warn if value <= slo else self.bad

    def attainment(self, value: float | None, target: float | None) -> str:
        """SLO attainment (0–1) against its target (default 0.95)."""
        if value is None:
            return self.dim
        t = 0.95 if target is None else target
        if value >= t:
            return self.ok
        return self.warn if value >= t - 0.10 else self.bad

    def usage(self, percent: float | None, warn_at: float = 80.0, bad_at: float = 95.0) -> str:
        """A fill level in percent (memory, KV cache, bandwidth)."""
        if percent is None:
            return self.dim
        if percent >= bad_at:
            return self.bad
        return self.warn if percent >= warn_at else self.ok


def _solid(value: str | None, default: str) -> str:
    """A CSS colour usable as a Rich style: ``#rrggbb`` (alpha dropped) or the default."""
    if not value:
        return default
    v = value.strip().split()[0]
    if v.startswith("#") and len(v) in (7, 9):
        return v[:7]
    return default
