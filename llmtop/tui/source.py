"""Where the TUI's snapshots come from.

The app only knows :class:`SnapshotSource`: live proxies through their admin API
(:class:`AdminSource`, this module), or a recording being replayed (``llmtop replay``
implements the same protocol, plus :class:`ReplayControl` for pause, seek and speed).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from llmtop.admin import AGE_HEADER
from llmtop.config import ConfigError, check_zone, has_control_char, socket_netloc
from llmtop.net_errors import connect_failure
from llmtop.tui.retries import Retries

SNAPSHOT_PATH = "/llmtop/v1/snapshot"
SNAPSHOT_KEYS = frozenset({"version", "window_s"})
"""Fields every llmtop snapshot has had: a reply without them is not an llmtop admin API."""
SNAPSHOT_VERSION = 1
"""The snapshot ``version`` this llmtop reads (``llmtop.metrics.snapshot.VERSION``, not
imported: the TUI never loads the metrics code). A proxy that sends another one changed
what some field means (``shared/docs/interfaces.md``): its figures shown or merged as
version 1's would be wrong without a word, so it is named down with the reason instead."""
NOT_ADMIN_404 = ("HTTP 404: not an llmtop admin API — a proxy's --listen port instead of "
                 "its --admin one?")
"""A 404 for the snapshot, which an llmtop admin API always serves: an engine, the proxy's
forwarding port (which hands the path to the engine) or some other server. Its own 404
text (an HTML page's first line, an engine's JSON error) said nothing an operator could
act on."""
REQUESTS_PATH = "/llmtop/v1/requests"
RECORDING_PATH = "/llmtop/v1/recording"

MergeFn = Callable[[list[dict[str, Any]]], dict[str, Any]]


class SourceUnavailable(Exception):
    """The source cannot answer now (proxy down, refused, bad reply). The message is one
    line, shown on screen; the app keeps retrying."""


class MergeUnavailable(ValueError):
    """Several admin URLs were given but no snapshot merge function is available."""


@runtime_checkable
class SnapshotSource(Protocol):
    """What the TUI reads. Snapshots are dicts in the admin API's JSON shape
    (``shared/docs/interfaces.md``); every field is optional to the TUI."""

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        """The snapshot over the last ``window_s`` seconds (``None``: the whole session).
        Raises :class:`SourceUnavailable` when it cannot."""
        ...

    async def active_requests(self) -> list[dict[str, Any]]:
        """Requests open right now (the ``/llmtop/v1/requests?state=active`` shape).
        Raises :class:`SourceUnavailable` when it cannot: the app then keeps the rows it
        has, marked as not refreshed (an empty list would say that nothing is open)."""
        ...

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        """Start (``action="start"``, to ``path``) or stop (``"stop"``) recording.
        Raises :class:`SourceUnavailable` when refused or unsupported."""
        ...

    def describe(self) -> str:
        """A short label for the header (URL, "3 proxies, 1 down", file name)."""
        ...

    async def close(self) -> None:
        """Release connections/files. Called once, when the app exits."""
        ...


@runtime_checkable
class ReplayControl(Protocol):
    """Optional capability of a replay source: the app adds space (pause), ←/→ (seek)
    and +/- (speed) when the source implements this."""

    speed: float
    """Playback speed multiplier (1.0 = real time); the app sets it."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def seek(self, delta_s: float) -> None:
        """Move the replay clock by ``delta_s`` seconds (negative: back)."""
        ...

    @property
    def position_s(self) -> float:
        """Seconds since the recording's start."""
        ...

    @property
    def duration_s(self) -> float | None:
        """Length of the recording, ``None`` when unknown (file still growing)."""
        ...


@runtime_checkable
class ReportsDown(Protocol):
    """Optional capability of a source over several proxies: it keeps showing the ones
    that answer, and says how many do not."""

    def down_label(self) -> str | None:
        """A short state for the header ("1/3 proxies down"), ``None`` when all answer."""
        ...


@runtime_checkable
class ReportsStaleRows(Protocol):
    """Optional capability of a source over several proxies: when some of them could not
    give their active requests, :meth:`SnapshotSource.active_requests` gives those
    proxies' last rows along with the others' fresh ones, and this says whose and why."""

    def stale_rows(self) -> Mapping[str, str]:
        """Per proxy (the ``proxy`` field of its rows), why its rows in the last
        ``active_requests()`` are its last known ones; empty when all are fresh."""
        ...


@runtime_checkable
class HasNotes(Protocol):
    """Optional capability of a source: what the user should be told as the TUI starts (a
    rotated recording's replay: other series left out, parts missing). The app shows each
    as a notification: lines the command printed on stderr just before would be under the
    TUI's screen while it runs."""

    @property
    def notes(self) -> tuple[str, ...]:
        """One line each; none most of the time."""
        ...


def normalize_admin_url(url: str) -> str:
    """``HOST:PORT`` or ``http(s)://HOST:PORT[/prefix]`` → ``http(s)://HOST:PORT[/prefix]``.
    Raises ``ValueError`` with a one-line message for anything else."""
    raw = url.strip()
    candidate = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(candidate)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL", which named no URL
        raise ValueError(f"'{url}' is not an admin URL ({exc})") from None
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"admin URL '{url}' has a bad port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{url}' is not an admin URL (expected http://HOST:PORT)")
    if port is None and "://" not in raw:
        raise ValueError(f"admin URL '{url}' needs a port (HOST:PORT)")
    if port == 0:  # (--admin HOST:0 binds a free port; the one chosen is what to attach to)
        raise ValueError(f"admin URL '{url}': port 0 is not a port to connect to; give the "
                         "port the proxy printed ('admin listening on …')")
    if "@" in parts.netloc:
        # the admin API takes a bearer token, not user:password (with --token as well,
        # aiohttp refused the request and the screen read "reply is not JSON"); the URL
        # is shown on screen, so the secret is not repeated in the message either
        raise ValueError(f"admin URL '{parts.scheme}://…@{parts.netloc.rpartition('@')[2]}' "
                         "carries credentials: give the admin token with --token or "
                         "LLMTOP_ADMIN_TOKEN instead")
    try:
        check_zone(parts.netloc)
    except ConfigError as exc:
        raise ValueError(f"admin URL '{url}': {exc}") from None
    path = parts.path.rstrip("/")
    for suffix in (SNAPSHOT_PATH, "/llmtop/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    # an IPv6 zone as a socket takes it (``%25eth0`` in a URL is ``%eth0`` to the resolver),
    # as ``llmtop run --upstream`` does
    return urlunsplit((parts.scheme, socket_netloc(parts.netloc), path, "", ""))


def load_merge() -> MergeFn:
    """``llmtop.metrics.merge.merge_snapshots``, imported only when several proxies are
    attached (it decodes histograms; the TUI itself never does)."""
    try:
        mod = importlib.import_module("llmtop.metrics.merge")
    except ImportError:
        raise MergeUnavailable(
            "attaching to several proxies needs llmtop.metrics.merge, which this build lacks"
        ) from None
    fn = getattr(mod, "merge_snapshots", None)
    if not callable(fn):
        raise MergeUnavailable("llmtop.metrics.merge has no merge_snapshots()")
    merge: MergeFn = fn
    return merge


def _error_text(body: str) -> str:
    """The one-line reason in an error reply: its JSON ``error`` field, or its first line."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return str(parsed["error"]).splitlines()[0][:200] if parsed["error"] else ""
    stripped = body.strip()
    return stripped.splitlines()[0][:160] if stripped else ""


class _Failure(Exception):
    """One proxy did not answer; the message is short."""


def _short(exc: BaseException) -> str:
    """Why an admin API could not be read, in a few words a user can act on: the
    connector's own reason (refused, host not found, TLS), not one word for all of them."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return connect_failure(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return (text or type(exc).__name__)[:80]


def per_proxy_path(path: str, i: int) -> str:
    """``x.jsonl.gz`` → ``x-<i>.jsonl.gz``: one recording file per attached proxy."""
    for ext in (".jsonl.gz", ".jsonl"):
        if path.endswith(ext):
            return f"{path[: -len(ext)]}-{i}{ext}"
    return f"{path}-{i}"


def _check_version(version: object) -> None:
    """:class:`_Failure` unless ``version`` is :data:`SNAPSHOT_VERSION`."""
    if type(version) is int and version == SNAPSHOT_VERSION:
        return
    shown = json.dumps(version)[:20] if isinstance(version, str | int | float | None) else (
        type(version).__name__)
    if type(version) is int and version > SNAPSHOT_VERSION:
        raise _Failure(f"its snapshot is version {shown}, newer than this llmtop reads "
                       f"({SNAPSHOT_VERSION}): attach with that proxy's llmtop version")
    raise _Failure(f"its snapshot version {shown} is not one this llmtop reads "
                   f"({SNAPSHOT_VERSION})")


SHARED_SNAPSHOT_AGE_S = 0.5
"""What the TUI commands accept as a snapshot's age: rates and percentiles are over 10 s
or more, and a screen polling at 10 Hz then costs the proxy two snapshots a second."""


@dataclass(frozen=True, slots=True)
class _Kept:
    until: float
    snap: dict[str, Any]
    active: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class _Answer:
    """One try at a proxy's snapshot, as it ended."""

    seq: int
    """The order tries were started in: an answer to an older try than the last one
    applied is late, and changes nothing (it would put an older state back)."""
    key: str
    """The query it asked (window, max_age …): a try finished in the background may have
    asked another window than the refresh that takes it."""
    asked: float
    done: float
    snap: dict[str, Any] | None
    age: float | None
    why: str
    """Why it failed (``snap`` is ``None``)."""


def _query(params: dict[str, str]) -> str:
    return "&".join(f"{k}={v}" for k, v in sorted(params.items()))


def _age(header: str | None) -> float | None:
    """:data:`AGE_HEADER`'s seconds; ``None`` when absent or not a number of seconds (an
    older proxy: its reply may be up to ``max_age`` old already, so it is not kept)."""
    try:
        age = float(header) if header else None
    except ValueError:
        return None
    return age if age is not None and 0.0 <= age <= 3600.0 else None  # also NaN


@dataclass(slots=True)
class _Proxy:
    """What :class:`AdminSource` knows of one admin URL."""

    auth: dict[str, str]
    """The header carrying its admin token (none when it has none)."""
    error: str | None = None
    """``None`` while it answers, else why it did not (last attempt)."""
    down_since: float | None = None
    """Since when (unix s) it has been left out."""
    started: float | None = None
    """The ``started_at`` of the proxy that last answered there."""
    restarted: float | None = None
    """When (the proxy's ``started_at``, unix s) a proxy answered there that is not the
    one that answered before: restarted, its counts from zero again."""
    newest: int = 0
    """The newest try whose answer was applied."""
    kept: dict[str, _Kept] = field(default_factory=dict)
    """Per query, the last snapshot and until when (monotonic) it is young enough for
    ``max_age_s``: a screen ticking faster than that asks no proxy for the bytes it
    already has."""
    active: list[dict[str, Any]] | None = None
    """The active requests that came with the last snapshot (``active=1``), until
    :meth:`AdminSource.active_requests` takes them."""
    unanswered: str | None = None
    """Why its snapshot failed in the last :meth:`AdminSource.fetch`: its active requests
    are not asked for separately (that would wait out a second timeout)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Its last active requests had, shown again while it cannot give them (several
    proxies: one proxy's failure must not blank its rows as if none were open, nor
    anyone else's)."""
    stale: str | None = None
    """Why its rows in the last :meth:`AdminSource.active_requests` are its kept ones."""


_DONE = {"start": "recording started", "stop": "recording stopped"}
"""What an action did, for the error that says where it went through."""


class AdminSource:
    """Snapshots from one or several running proxies' admin APIs over HTTP.

    With several URLs every fetch asks all of them at once and merges the snapshots
    exactly (histogram by histogram) with ``merge`` (default: ``llmtop.metrics.merge``).
    Proxies that do not answer are left out and named by :meth:`describe`; only when
    none answers does :meth:`fetch` raise :class:`SourceUnavailable`. One that failed is
    tried again after a backoff, in the background (:mod:`llmtop.tui.retries`): the
    refreshes go at the pace of the proxies that answer.
    """

    def __init__(
        self,
        urls: Sequence[str],
        token: str | Sequence[str] = "",
        *,
        timeout_s: float = 2.0,
        merge: MergeFn | None = None,
        max_age_s: float = 0.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one admin URL is needed")
        self.urls: list[str] = [normalize_admin_url(u) for u in urls]
        tokens = [token] if isinstance(token, str) else list(token)
        if len(tokens) not in (1, len(self.urls)):
            raise ValueError(f"{len(tokens)} admin tokens for {len(self.urls)} admin URLs: "
                             "give one for all, or one per URL in the same order")
        if any(has_control_char(tok) for tok in tokens):  # the request would never be sent
            raise ValueError("an admin token has a control character (a line end from a "
                             "token file?): no proxy could receive it; remove it")
        self._proxies: dict[str, _Proxy] = {
            url: _Proxy({"Authorization": f"Bearer {tok}"} if tok else {})
            for url, tok in zip(self.urls, tokens * len(self.urls) if len(tokens) == 1
                                else tokens, strict=True)}
        """Per URL, what is known of it (a URL given twice has one)."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._merge: MergeFn | None = merge
        self.max_age_s = max_age_s
        """A snapshot (and a list of active requests) built up to this long ago will do
        (``?max_age``): a proxy then builds at most one per that period however many
        screens poll it, however fast."""
        if len(self.urls) > 1 and self._merge is None:
            self._merge = load_merge()
        self._session: aiohttp.ClientSession | None = None
        self.gets = 0
        """HTTP requests made so far (what polling costs the proxies; benchmarks read it)."""
        self._retries: Retries[_Answer] = Retries()
        """With several URLs, those whose last try failed: when each is tried again, and
        that try (one proxy alone is asked at every fetch: the app's own retry pace)."""
        self._tries = 0
        """Tries at a snapshot started so far (:attr:`_Answer.seq`)."""

    @property
    def errors(self) -> dict[str, str | None]:
        """Per URL: ``None`` while it answers, else why it did not (last attempt). A
        copy: changing it changes nothing here."""
        return {url: p.error for url, p in self._proxies.items()}

    @property
    def restarted(self) -> dict[str, float]:
        """Per URL where a proxy answered that is not the one that answered before
        (restarted, its counts from zero again), when: that proxy's ``started_at`` (unix
        s). A copy, in the order of :attr:`urls`."""
        return {url: p.restarted for url, p in self._proxies.items()
                if p.restarted is not None}

    # -- HTTP ------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _get(self, url: str, path: str, params: dict[str, str]) -> Any:
        return (await self._get_aged(url, path, params))[0]

    async def _get_aged(self, url: str, path: str, params: dict[str, str]
                        ) -> tuple[Any, float | None]:
        """The decoded reply and its age in seconds (:data:`AGE_HEADER`; ``None`` when
        the proxy does not say)."""
        self.gets += 1
        try:
            async with self._http().get(url + path, params=params,
                                        headers=self._proxies[url].auth) as resp:
                if resp.status in (401, 403):
                    raise _Failure(f"HTTP {resp.status}: the admin token was refused")
                if resp.status == 404 and path == SNAPSHOT_PATH:
                    raise _Failure(NOT_ADMIN_404)
                if resp.status != 200:
                    reason = _error_text(await resp.text())
                    raise _Failure(f"HTTP {resp.status} {reason}".strip())
                return (await resp.json(content_type=None, loads=orjson.loads),
                        _age(resp.headers.get(AGE_HEADER)))
        except _Failure:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _Failure(_short(exc)) from None
        except ValueError:
            raise _Failure("reply is not JSON: not an llmtop admin API") from None

    async def _try(self, url: str, params: dict[str, str]) -> _Answer:
        """One try at ``url``'s snapshot; never raises (it may run as a task nobody
        awaits)."""
        self._tries += 1
        seq, asked = self._tries, time.monotonic()
        try:
            snap, age = await self._get_aged(url, SNAPSHOT_PATH, params)
            if not isinstance(snap, dict):
                raise _Failure("reply is not a snapshot object")
            if not snap.keys() >= SNAPSHOT_KEYS:
                raise _Failure("not an llmtop admin API (its reply has no snapshot fields)")
            _check_version(snap["version"])
        except _Failure as exc:
            return _Answer(seq, _query(params), asked, time.monotonic(), None, None, str(exc))
        return _Answer(seq, _query(params), asked, time.monotonic(), snap, age, "")

    async def _snapshot_from(self, url: str, params: dict[str, str]) -> dict[str, Any] | None:
        proxy = self._proxies[url]
        kept = proxy.kept.get(_query(params))
        if kept is not None and time.monotonic() < kept.until:
            # young enough for max_age: the proxy would send the same bytes
            if kept.active is not None:
                proxy.active = kept.active
            return kept.snap
        return self._apply(url, await self._try(url, params))

    def _apply(self, url: str, got: _Answer) -> dict[str, Any] | None:
        """What ``got`` says of ``url``, remembered unless a newer try's answer was
        already (a late answer put back an older proxy's start, an older snapshot to keep,
        a failure after a success); the snapshot, ``None`` when it failed."""
        proxy = self._proxies[url]
        late = got.seq < proxy.newest
        if not late:
            proxy.newest = got.seq
        if got.snap is None:
            proxy.unanswered = got.why
            if not late:
                self._down(url, got.why)
                proxy.kept.pop(got.key, None)
                if len(self.urls) > 1:
                    self._retries.failed(url, got.done)
            return None
        snap = got.snap
        rows = snap.pop("active_requests", None)  # an older proxy leaves it out
        if late:
            return snap  # (the fetch that asked it merges it; the newer answer stands)
        self._retries.answered(url)
        proxy.error = None
        started = snap.get("started_at")
        if isinstance(started, int | float) and not isinstance(started, bool):
            if proxy.started is not None and proxy.started != started:
                proxy.restarted = float(started)
            proxy.started = float(started)
        active = rows if isinstance(rows, list) else None
        if active is not None:
            proxy.active = active
        if self.max_age_s > 0 and got.age is not None:
            # built at least `age` before we asked: young enough until then + max_age
            proxy.kept[got.key] = _Kept(got.asked - got.age + self.max_age_s, snap, active)
        return snap

    def _taken(self, url: str, query: str) -> dict[str, Any] | None:
        """For a URL waiting to be tried again: its try in the background, if it has
        finished, and its snapshot when it answered what this fetch asks; else ``None``
        (and its rows are not asked for: that would wait for it after all)."""
        got = self._retries.take(url)
        if got is not None and got.snap is not None and got.key != query:
            # it answered another window's query (`w` meanwhile): not merged as this
            # one's, but it answers: asked with the others from the next fetch on
            if got.seq >= self._proxies[url].newest:
                self._retries.answered(url)
            got = None
        if got is None:
            proxy = self._proxies[url]
            proxy.unanswered = proxy.error or "no answer yet"
            return None
        return self._apply(url, got)

    def _down(self, url: str, why: str) -> None:
        proxy = self._proxies[url]
        if proxy.down_since is None:
            proxy.down_since = time.time()
        proxy.error = why

    # -- SnapshotSource ----------------------------------------------------------------------

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        params = {"window": "all" if window_s is None else str(int(window_s)), "active": "1"}
        if self.max_age_s > 0:
            params["max_age"] = f"{self.max_age_s:g}"
        for proxy in self._proxies.values():
            proxy.active = proxy.unanswered = None
        if len(self.urls) > 1:
            params["user_histograms"] = "1"  # per-user percentiles then merge exactly
        else:
            params["histograms"] = "0"  # only a merge reads them
        snaps = await self._gather(params)
        ok = [s for s in snaps if s is not None]
        if not ok:
            if len(self.urls) == 1:
                raise SourceUnavailable(f"{self.urls[0]}: {self._proxies[self.urls[0]].error}")
            raise SourceUnavailable(f"none of {len(self.urls)} proxies answers: " + "; ".join(
                f"{u}: {self._proxies[u].error}" for u in self.urls))
        if len(self.urls) == 1 or self._merge is None:
            return self._with_notes(ok[0], window_s)
        try:
            return self._with_notes(self._merge(ok), window_s)
        except ValueError as exc:  # e.g. proxies answering for different windows
            first_error = exc
        # one proxy the others cannot merge with must not blank the view: leave it out
        # (named as down, with the reason) and show the others merged
        answered = [(u, s) for u, s in zip(self.urls, snaps, strict=True) if s is not None]
        for odd, _ in answered:
            rest = [s for u, s in answered if u != odd]
            try:
                merged = rest[0] if len(rest) == 1 else self._merge(rest)
            except ValueError:
                continue
            self._down(odd, f"cannot be merged with the others ({first_error})")
            return self._with_notes(merged, window_s)
        raise SourceUnavailable(f"cannot merge the proxies' snapshots: {first_error}")

    async def _gather(self, params: dict[str, str]) -> list[dict[str, Any] | None]:
        """Each URL's snapshot, ``None`` for those that did not answer. Those that failed
        before are tried in the background when due (:class:`Retries`), waited for only
        as long as the others take. When none of them answered before, all are tried
        (the app's own retry pace while disconnected, as with one proxy) and waited for:
        nothing else is to be shown."""
        query = _query(params)
        asked = [u for u in self.urls if u not in self._retries]
        self._retries.start_due(time.monotonic(), lambda url: self._try(url, params),
                                every=not asked)
        got = dict(zip(asked, await asyncio.gather(
            *(self._snapshot_from(u, params) for u in asked)), strict=True))
        pending = self._retries.pending()
        if pending and not any(s is not None for s in got.values()):
            await asyncio.wait(pending)
        for url in self.urls:
            if url not in got:  # waiting for its backoff, or for its try's answer
                got[url] = self._taken(url, query)
        return [got[u] for u in self.urls]

    def _with_notes(self, snap: dict[str, Any], window_s: int | None) -> dict[str, Any]:
        """``snap`` with what attach knows of the proxies and they cannot say themselves:

        - ``PROXY_DOWN`` for each one left out, with why (the header names it down, but
          "down" alone left a refused token, a wrong port, a proxy of another snapshot
          version and a dead host looking the same), and when it is tried next;
        - ``PROXY_RESTARTED`` for each one that restarted within the window (the whole
          session: since attach began). Its counters start from zero again: without a
          word, the fleet's whole-session figures went back by all it had counted, and
          the header read "2 proxies" as before."""
        for p in self._proxies.values():
            if p.error is None:  # (one that answers but cannot be merged stays down since then)
                p.down_since = None
        now, tick = snap.get("time"), time.monotonic()
        notes = [
            {"code": "PROXY_DOWN", "severity": "warning", "since": p.down_since,
             "message": f"the proxy at {url} is left out: {p.error}"
                        f"{self._retries.note(url, tick)}"}
            for url, p in self._proxies.items() if p.error is not None and len(self.urls) > 1]
        notes += [
            {"code": "PROXY_RESTARTED", "severity": "info", "since": at,
             "message": f"the proxy at {url} restarted: what it counted before is gone, so "
                        "figures over a span from before then leave it out"}
            for url, at in self.restarted.items()
            if window_s is None or not isinstance(now, int | float) or now - at < window_s]
        if not notes:
            return snap
        warnings = snap.get("warnings")  # a copy: ``snap`` may be kept for the next fetch
        return {**snap, "warnings": [*(warnings if isinstance(warnings, list) else []),
                                     *notes]}

    async def active_requests(self) -> list[dict[str, Any]]:
        """Each proxy's rows: those that came with its snapshot, else (an older proxy)
        from ``/requests``. A proxy that cannot give them keeps its last rows, named by
        :meth:`stale_rows`; with one proxy, :class:`SourceUnavailable` says why."""
        params = {"state": "active"}
        if self.max_age_s > 0:
            params["max_age"] = f"{self.max_age_s:g}"

        async def one(url: str) -> list[dict[str, Any]] | str:
            """The proxy's rows, or why it has none to give now."""
            proxy = self._proxies[url]
            got: Any = proxy.active  # came with the snapshot just fetched
            proxy.active = None
            if got is None:
                unanswered, proxy.unanswered = proxy.unanswered, None
                if unanswered is not None:
                    return unanswered
                try:
                    got = await self._get(url, REQUESTS_PATH, params)
                except _Failure as exc:
                    return str(exc)
            if isinstance(got, dict):
                got = got.get("requests")
            if not isinstance(got, list):
                return "reply is not a list of requests"
            rows = [r for r in got if isinstance(r, dict)]
            if len(self.urls) > 1:
                for r in rows:
                    r.setdefault("proxy", url)
            return rows

        results = await asyncio.gather(*(one(u) for u in self.urls))
        for proxy in self._proxies.values():
            proxy.stale = None
        out: list[dict[str, Any]] = []
        for url, got in zip(self.urls, results, strict=True):
            proxy = self._proxies[url]
            if isinstance(got, str):
                if len(self.urls) == 1:
                    raise SourceUnavailable(got)
                proxy.stale = got
                out += proxy.rows
            else:
                proxy.rows = got
                out += got
        return out

    def stale_rows(self) -> Mapping[str, str]:
        return {url: p.stale for url, p in self._proxies.items() if p.stale is not None}

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        """Every proxy asked at once, each to its own file (:func:`per_proxy_path`). One
        that refuses or cannot be reached does not keep the others from being asked: the
        error names it, and the proxies where the action went through."""

        async def one(i: int, url: str) -> dict[str, Any] | str:
            body: dict[str, Any] = {"action": action}
            if path:
                body["path"] = path if len(self.urls) == 1 else per_proxy_path(path, i)
            try:
                async with self._http().post(url + RECORDING_PATH, json=body,
                                             headers=self._proxies[url].auth) as resp:
                    text = await resp.text()
                    if resp.status >= 400:
                        return (f"recording {action} refused by {url}: HTTP {resp.status} "
                                f"{_error_text(text)}")
                    try:
                        reply = json.loads(text)
                    except ValueError:
                        reply = {}
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                return f"recording {action} at {url}: {_short(exc)}"
            return reply if isinstance(reply, dict) else {"reply": reply}

        results = await asyncio.gather(*(one(i, u) for i, u in enumerate(self.urls, 1)))
        failed = [r for r in results if isinstance(r, str)]
        if failed:
            done = [u for u, r in zip(self.urls, results, strict=True) if not isinstance(r, str)]
            went = f"; {_DONE.get(action, action + ' done')} at {', '.join(done)}" if done else ""
            raise SourceUnavailable("; ".join(failed) + went)
        replies = [r for r in results if not isinstance(r, str)]
        if len(replies) == 1:
            return replies[0]
        return {"proxies": replies}

    def describe(self) -> str:
        down = [u for u, p in self._proxies.items() if p.error is not None]
        if len(self.urls) == 1:
            url = self.urls[0]
            return f"{url} (down: {self._proxies[url].error})" if down else url
        up = len(self.urls) - len(down)
        if not down:
            return f"{len(self.urls)} proxies"
        # (why each is down is a PROXY_DOWN warning: here it would push the list out of
        # the header at all but the widest screens)
        return f"{up}/{len(self.urls)} proxies up · down: " + ", ".join(down)

    def down_label(self) -> str | None:
        """With several proxies, "1/3 proxies down" while some do not answer (with one,
        its being down is the app's DISCONNECTED state)."""
        down = sum(p.error is not None for p in self._proxies.values())
        if len(self.urls) == 1 or not down:
            return None
        return f"{down}/{len(self.urls)} proxies down"

    async def close(self) -> None:
        await self._retries.close()  # before the session they use
        if self._session is not None:
            await self._session.close()
            self._session = None
