"""Which of the active requests on screen are not the latest, and why.

The rows come from a fetch of their own (with the snapshot, or beside it from an older
proxy), which can fail while the figures do not; so can one proxy's of several. The rows
last had are then kept on screen and said to be old: an empty list would say that no
request is open, and an open request's modal would say "finished" — both false."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StaleRows:
    """Nothing stale by default."""

    everything: str | None = None
    """Why no row was refreshed (the fetch failed, or a lone proxy's list did)."""
    proxies: tuple[tuple[str, str], ...] = ()
    """(proxy URL, why) for each of several proxies whose rows alone were not refreshed:
    those rows are its last ones, the others' are fresh."""

    @classmethod
    def of_proxies(cls, failed: Mapping[str, str]) -> StaleRows:
        return cls(proxies=tuple(sorted(failed.items())))

    def why(self, proxy: str | None) -> str | None:
        """Why the rows of ``proxy`` (a row's ``proxy`` field; ``None`` with one proxy)
        were not refreshed; ``None`` when they were."""
        if self.everything is not None:
            return self.everything
        return next((why for url, why in self.proxies if url == proxy), None)

    def label(self) -> str | None:
        """A few words for the requests panel's title; ``None`` when every row is fresh."""
        if self.everything is not None:
            return f"not refreshed: {self.everything}"
        if not self.proxies:
            return None
        url, why = self.proxies[0]
        if len(self.proxies) == 1:
            return f"{url}'s not refreshed: {why}"
        return f"{len(self.proxies)} proxies' not refreshed: {url}: {why}; …"
