"""The admin API (``shared/docs/interfaces.md``), served on the admin address only.

=====================================  =================================================
``GET  /llmtop/v1/snapshot``            ``?window=10|60|300|all`` (default 60); add
                                        ``user_histograms=1`` for what an exact merge
                                        needs: per-user histograms and ``capacity.bins``;
                                        ``max_age=S`` accepts a snapshot built up to S
                                        seconds ago (0–10; default 0: a fresh one);
                                        ``histograms=0`` leaves the system's encoded
                                        histograms out (a screen that does not merge);
                                        ``active=1`` adds ``active_requests`` (what
                                        ``/requests?state=active`` answers), so a
                                        screen's tick is one request; the answer's
                                        ``X-Llmtop-Age`` header says how old it is
``GET  /llmtop/v1/requests``            ``?state=active|recent`` (default active),
                                        ``&limit=N`` (recent: the last N, default 100);
                                        ``max_age=S`` as for the snapshot (a list built
                                        up to S seconds ago will do)
``GET  /metrics``                       Prometheus text exposition
``POST /llmtop/v1/recording``           ``{"action": "start", "path": "..."}`` or
                                        ``{"action": "stop"}``
``GET  /llmtop/v1/recording``           the current recording's status (or null)
``GET  /llmtop/v1/health``              liveness and a few totals
=====================================  =================================================

Errors are JSON ``{"error": "<one line>"}`` with a fitting status: 400 bad input (a known
query parameter given twice, a yes/no parameter that is neither ``1/true/yes`` nor
``0/false/no``, a recording body that is not a JSON object in UTF-8 or cannot be decoded,
a recording path ending in ``/`` or not in ``.jsonl``/``.jsonl.gz``), 401 missing or wrong
token, 404 unknown route or missing directory, 409 recording state conflict, 501 no
recorder in this process, 503 a recording file that cannot be opened now (the process is
out of file descriptors: retry later), 403 a request from a web page (below). Unknown query
parameters are ignored (a newer client may send what this proxy does not know).
Without a token, web pages are kept out: the admin API serves none, so a request with an
``Origin`` other than its own (a script on some web site the user has open, posting
``{"action": "start"}`` as ``text/plain``, which needs no CORS preflight) is refused; and
while it listens on loopback (``AdminContext.loopback``) so is a request whose ``Host`` is
not ``localhost`` or a loopback address — a site whose DNS name has been re-pointed at
127.0.0.1 (DNS rebinding) would otherwise read the snapshot as its own origin. (A token
is a secret no web page has, so with one set these checks are not needed.)
When ``admin_token`` is set every route —
``/metrics`` and health included — requires ``Authorization: Bearer <token>`` (compared
in constant time) — except the paths in ``AdminContext.self_authenticated``, whose
handlers check a secret of their own (the workers' ingest route).

The snapshot is built on the observers' event loop (in one-process llmtop, a thread of its
own beside the proxy's loop: :mod:`llmtop.loopthread`; the aggregator is not thread-safe,
so everything here runs on that loop); ``benchmarks/metrics_cost.py`` measures its cost.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import json
import math
import operator
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from llmtop import __version__
from llmtop.admin import AGE_HEADER
from llmtop.config import is_loopback
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import RECENT_MAX, Aggregator, active_rows
from llmtop.metrics.prometheus import LlmtopCollector
from llmtop.metrics.promtext import Family
from llmtop.metrics.promtext import encode as encode_exposition
from llmtop.textsafe import printable

PREFIX: Final = "/llmtop/v1"
WINDOW_PARAMS: Final = {"10": 10, "60": 60, "300": 300, "all": None}
MAX_AGE_LIMIT_S: Final = 10.0
DEFAULT_RECENT: Final = 100
REQUEST_LISTS_MAX: Final = 8
"""At most this many ``/requests`` lists are kept for ``max_age`` callers."""


class RecordingControl(Protocol):
    """What the admin API needs from a recorder (``llmtop.recording`` implements it).

    ``start`` and ``stop`` return the recording's status. Errors, by type: ``ValueError``
    for a request that cannot be honoured (400; the message is shown to the user; 503
    when its ``retry_later`` is true: the file cannot be opened now, the process being
    out of file descriptors), ``FileNotFoundError`` (404), ``PermissionError`` (403),
    other ``OSError`` (400).
    Starting while recording or stopping while not is answered 409 before the call.
    """

    def start(self, path: str) -> dict[str, Any]: ...

    def stop(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any] | None:
        """The running recording's status, ``None`` when not recording."""
        ...


@dataclass
class AdminContext:
    """Everything the routes read. ``extra_info`` is merged into each snapshot's top level
    (e.g. ``upstream``, ``llmtop_version``)."""

    aggregator: Aggregator
    active: Mapping[str, ActiveRequest]
    recording: RecordingControl | None = None
    admin_token: str = ""
    loopback: bool = False
    """The admin API listens on loopback only: a request must name it as ``localhost`` or
    a loopback address in its ``Host`` (see the module's docstring)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    self_authenticated: frozenset[str] = frozenset()
    """Paths whose handlers authenticate the caller themselves (the coordinator's ingest
    route, checked against the workers' own secret): the admin token is not asked there,
    since the workers do not hold it."""
    snapshots: dict[tuple[str, bool, bool, bool], tuple[float, bytes]] = field(
        default_factory=dict)
    """The last snapshot built per (window, mergeable, histograms, active): when
    (monotonic) and its JSON.
    Callers that accept some age (``max_age``: the TUI, dashboards polling fast) share
    it, so ten TUIs at 10 Hz cost the proxy what one costs."""
    request_lists: dict[tuple[str, int], tuple[float, bytes]] = field(default_factory=dict)
    """The same for ``/requests``, per (state, limit): the active list is built and
    encoded once per ``max_age`` however many screens poll it. Bounded (see
    :func:`remember_list`): at most :data:`REQUEST_LISTS_MAX` lists, together at most
    ``request_lists_max_bytes``, none older than :data:`MAX_AGE_LIMIT_S` (no ``max_age``
    could use it) — a recent list of long answers is megabytes, and callers asking for
    many different ``limit`` values grew it without end (15 limits: +126 MB)."""
    request_lists_max_bytes: int = 64 << 20
    series_json: tuple[list[Any], orjson.Fragment] | None = field(default=None, repr=False)
    """The last snapshot's ``series`` (its points) and their JSON: the points change only
    when a fine interval closes (every 2 s), snapshots are built twice a second, and the
    series is a third of a screen's snapshot JSON."""


CTX: Final = web.AppKey("llmtop_admin_ctx", AdminContext)
COLLECTOR: Final = web.AppKey("llmtop_admin_collector", LlmtopCollector)


_ORJSON_OPTIONS: Final = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
"""Keys that are not strings become strings and numpy scalars plain numbers, as with
``json.dumps`` (which takes ``np.float64`` as the float it subclasses)."""


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None
                  ) -> web.Response:
    """A JSON response that is always valid JSON (non-finite floats become null).

    Encoded by orjson: a screen's snapshot (~40 KB, thousands of floats) in 0.1 ms where
    ``json.dumps`` takes 1 ms, on the loop that also files the proxy's records. What
    orjson refuses (an int past 64 bits) goes through ``json`` instead.
    """
    try:
        body = orjson.dumps(data, option=_ORJSON_OPTIONS)
    except TypeError:
        body = json.dumps(_finite(data), allow_nan=False).encode()
    return web.Response(body=body, status=status, content_type="application/json",
                        charset="utf-8", headers=headers)


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None
               ) -> web.Response:
    return json_response({"error": message}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Browser and token checks on every route, and JSON bodies for aiohttp's own HTTP
    errors."""
    ctx = request.app[CTX]
    token = ctx.admin_token
    refused = None if token else _from_a_browser(request, ctx.loopback)
    if refused is not None:
        return json_error(403, refused)
    if token and request.path not in ctx.self_authenticated:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8")
        )
        if not ok:
            return json_error(401, "admin token required: send 'Authorization: Bearer <token>'",
                              headers={"WWW-Authenticate": 'Bearer realm="llmtop"'})
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        hdrs = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return json_error(exc.status, exc.reason, headers=hdrs)


def _from_a_browser(request: web.Request, loopback: bool) -> str | None:
    """Why a request is refused as coming from a web page, or ``None`` (see the module's
    docstring). Clients that are not browsers send no ``Origin``."""
    host = request.headers.get("Host")
    if loopback and host is not None and not _loopback_name(host):
        return (f"Host '{printable(host)}' is not a loopback name: this admin API listens on "
                "loopback and answers only requests addressed to localhost or a loopback "
                "address (a guard against DNS rebinding; with an admin token set, any name "
                "is answered)")
    origin = request.headers.get("Origin")
    if origin is not None and (host is None or origin.lower() not in (
            f"http://{host.lower()}", f"https://{host.lower()}")):
        return (f"a request from a web page (Origin '{printable(origin)}') is refused: the "
                "admin API takes no cross-site requests")
    return None


def _loopback_name(host: str) -> bool:
    """``Host`` (with or without its port) names this machine's loopback: ``localhost``,
    a name under ``.localhost`` (RFC 6761), or a loopback IP literal."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.removesuffix(".")
    return name.endswith(".localhost") or is_loopback(name)


async def snapshot(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    dup = _repeated(request, SNAPSHOT_PARAMS)
    if dup is not None:
        return dup
    raw = request.query.get("window", "60").strip().lower()
    if raw not in WINDOW_PARAMS:
        return json_error(400, f"window must be one of 10, 60, 300, all (got {raw!r})")
    flags: list[bool] = []
    for name, default in (("user_histograms", False), ("histograms", True), ("active", False)):
        value = _flag(request, name, default)
        if value is None:
            return json_error(400, f"{name} must be 1 or 0 (true/false, yes/no; got "
                                   f"{request.query[name]!r})")
        flags.append(value)
    mergeable, with_hist, with_active = flags
    max_age = _max_age(request)
    if max_age is None:
        return _max_age_error()
    key = (raw, mergeable, with_hist, with_active)
    now = time.monotonic()
    hit = ctx.snapshots.get(key)
    if hit is not None and now - hit[0] <= max_age:
        return _shared(hit, now)
    snap = ctx.aggregator.snapshot(WINDOW_PARAMS[raw], user_histograms=mergeable,
                                   capacity_bins=mergeable, histograms=with_hist)
    snap.update(ctx.extra_info)
    snap["recording"] = ctx.recording.status() if ctx.recording is not None else None
    if with_active:  # a screen's whole tick in one request (one GET, not two)
        snap["active_requests"] = active_rows(ctx.active)
    body = snapshot_json(ctx, snap)
    ctx.snapshots[key] = (now, body)
    resp = web.Response(body=body, content_type="application/json", charset="utf-8")
    resp.headers[AGE_HEADER] = "0"
    return resp


def snapshot_json(ctx: AdminContext, snap: dict[str, Any]) -> bytes:
    """``snap`` as :func:`json_response` encodes it, with its ``series`` encoded once per
    change of its points (kept in ``ctx.series_json``) rather than at every build."""
    series = snap.get("series")
    try:
        if isinstance(series, list) and series:
            snap["series"] = _series_fragment(ctx, series)
        return orjson.dumps(snap, option=_ORJSON_OPTIONS)
    except TypeError:  # what orjson refuses (an int past 64 bits): as json_response does
        snap["series"] = series
        return json.dumps(_finite(snap), allow_nan=False).encode()


def _series_fragment(ctx: AdminContext, series: list[Any]) -> orjson.Fragment:
    """The JSON of ``series``, reused while it holds the same point objects (points are
    never changed once made: a new interval's point is a new dict)."""
    held = ctx.series_json
    if held is not None and len(held[0]) == len(series) \
            and all(map(operator.is_, held[0], series)):
        return held[1]
    fragment = orjson.Fragment(orjson.dumps(series, option=_ORJSON_OPTIONS))
    ctx.series_json = (series, fragment)
    return fragment


SNAPSHOT_PARAMS: Final = ("window", "user_histograms", "histograms", "active", "max_age")
REQUESTS_PARAMS: Final = ("state", "limit", "max_age")
_TRUE: Final = frozenset(("1", "true", "yes"))
_FALSE: Final = frozenset(("0", "false", "no"))


def _repeated(request: web.Request, names: tuple[str, ...]) -> web.Response | None:
    """400 when one of ``names`` is given more than once (``window=10&window=all`` used to
    answer for the first and ignore the second); ``None`` when each is given at most once.
    Unknown parameters are left alone: a newer client may send what this proxy does not
    know yet."""
    for name in names:
        if len(request.query.getall(name, ())) > 1:
            return json_error(400, f"{name} given more than once")
    return None


def _flag(request: web.Request, name: str, default: bool) -> bool | None:
    """A yes/no parameter: ``default`` when absent or empty, ``None`` when it is neither
    (``histograms=maybe`` used to mean yes and ``user_histograms=2`` no, silently)."""
    raw = request.query.get(name, "").strip().lower()
    if not raw:
        return default
    return True if raw in _TRUE else False if raw in _FALSE else None


def _shared(hit: tuple[float, bytes], now: float) -> web.Response:
    """A snapshot or list built earlier (``max_age``), with its age in :data:`AGE_HEADER`."""
    return web.Response(body=hit[1], content_type="application/json", charset="utf-8",
                        headers={AGE_HEADER: f"{max(0.0, now - hit[0]):.3f}"})


_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def _max_age(request: web.Request) -> float | None:
    """The ``max_age`` parameter (0 when absent: a fresh answer); ``None`` when invalid.
    Plain decimals (an exponent allowed: ``f"{x:g}"`` writes 1e-05) only: Python's
    ``float`` also takes ``1_0``, ``+5``, ``inf`` and other scripts' digits, which no client
    means."""
    raw = request.query.get("max_age", "0").strip()
    if not _DECIMAL.fullmatch(raw):
        return None
    max_age = float(raw)
    return max_age if max_age <= MAX_AGE_LIMIT_S else None


def _max_age_error() -> web.Response:
    return json_error(400, f"max_age must be a number of seconds from 0 to "
                           f"{MAX_AGE_LIMIT_S:g}")


async def requests_(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    dup = _repeated(request, REQUESTS_PARAMS)
    if dup is not None:
        return dup
    state = request.query.get("state", "active").strip().lower()
    raw_limit = request.query.get("limit", str(DEFAULT_RECENT)).strip()
    if not _INTEGER.fullmatch(raw_limit):  # not int()'s "1_0", "+5", "٥"
        return json_error(400, "limit must be an integer")
    limit = int(raw_limit)
    if not 0 <= limit <= RECENT_MAX:
        return json_error(400, f"limit must be between 0 and {RECENT_MAX}")
    if state not in ("active", "recent"):
        return json_error(400, f"state must be active or recent (got {state!r})")
    max_age = _max_age(request)
    if max_age is None:
        return _max_age_error()
    key = (state, limit if state == "recent" else 0)
    now = time.monotonic()
    hit = ctx.request_lists.get(key)
    if hit is not None and now - hit[0] <= max_age:
        return _shared(hit, now)
    if state == "active":
        resp = json_response(active_rows(ctx.active))
    else:
        resp = json_response(ctx.aggregator.recent_requests(limit))
    if isinstance(resp.body, bytes):
        remember_list(ctx, key, now, resp.body)
    resp.headers[AGE_HEADER] = "0"
    return resp


def remember_list(ctx: AdminContext, key: tuple[str, int], now: float, body: bytes) -> None:
    """Keep ``body`` as the latest list for ``key`` and drop what no caller should be
    served or what is over the bounds: lists built more than :data:`MAX_AGE_LIMIT_S` ago,
    then the oldest while more than :data:`REQUEST_LISTS_MAX` are kept or together they
    are over ``ctx.request_lists_max_bytes`` (the newest is always kept)."""
    lists = ctx.request_lists
    lists.pop(key, None)
    for k in [k for k, (t, _) in lists.items() if now - t > MAX_AGE_LIMIT_S]:
        del lists[k]
    lists[key] = (now, body)  # insertion order is build order: the oldest first
    size = sum(len(b) for _, b in lists.values())
    while len(lists) > 1 and (len(lists) > REQUEST_LISTS_MAX
                              or size > ctx.request_lists_max_bytes):
        size -= len(lists.pop(next(iter(lists)))[1])


async def metrics(request: web.Request) -> web.Response:
    # reading the aggregator happens here, on its loop (plain values, ~8 ms at 1,000
    # users); writing the text (llmtop.metrics.promtext, ~18 ms there; prometheus_client's
    # formatter took 250 ms for text and 480 ms for OpenMetrics) goes to a thread so this
    # loop answers other admin requests meanwhile. The format is the one the scraper asks
    # for: OpenMetrics when its Accept names it (Prometheus sends that first), else text.
    # Compressed when the scraper takes gzip (Prometheus asks for it): the text is ~10 times
    # smaller, and compressing it is a few ms in the same thread.
    families = request.app[COLLECTOR].families()
    zipped = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body, content_type = await asyncio.get_running_loop().run_in_executor(
        None, _exposition, families, request.headers.get("Accept", ""), zipped)
    headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
    if zipped:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


def _exposition(families: list[Family], accept: str, zipped: bool) -> tuple[bytes, str]:
    body, content_type = encode_exposition(families, accept)
    return (gzip.compress(body, compresslevel=6, mtime=0) if zipped else body), content_type


def accepts_gzip(header: str) -> bool:
    """``Accept-Encoding`` takes gzip: ``gzip`` (or ``x-gzip``, or ``*`` without a gzip of
    its own) with a q-value above 0 (RFC 9110 12.5.3). A value that cannot be read is no."""
    star: bool | None = None
    for part in header.split(","):
        name, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for p in params:
            key, _, value = p.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # (nan, out of range: not a q-value)
                    q = 0.0
        name = name.lower()
        if name in ("gzip", "x-gzip"):
            return q > 0
        if name == "*":
            star = q > 0
    return bool(star)


async def recording_status(request: web.Request) -> web.Response:
    rec = request.app[CTX].recording
    return json_response({"available": rec is not None,
                          "recording": rec.status() if rec is not None else None})


async def recording_control(request: web.Request) -> web.Response:
    rec = request.app[CTX].recording
    try:
        raw = await request.read()
    except RequestPayloadError as exc:  # e.g. "Content-Encoding: gzip" on a body that is not
        return json_error(400, f"body could not be read: {_one_line(exc)}")  # (was a 500)
    try:
        # orjson: JSON is UTF-8 whatever the Content-Type says, and nesting past 1024 levels
        # is refused (json.loads raised RecursionError there: a 500 and a traceback)
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json_error(400, "body must be a JSON object: {\"action\": \"start\"|\"stop\", "
                               "\"path\": \"...\"}")
    if not isinstance(body, dict):
        return json_error(400, "body must be a JSON object")
    action = body.get("action")
    if action not in ("start", "stop"):
        return json_error(400, "action must be \"start\" or \"stop\"")
    if rec is None:
        return json_error(501, "recording is not available in this process")
    current = rec.status()
    try:
        if action == "start":
            path = body.get("path")
            if not isinstance(path, str) or not path.strip():
                return json_error(400, "start needs a non-empty \"path\"")
            if path.endswith(("/", os.sep)):  # was a file named after the directory
                return json_error(400, f"{path}: names a directory; give a file name such "
                                       "as DIR/session.jsonl")
            if not path.endswith((".jsonl", ".jsonl.gz")):
                # whoever reaches this API may not pick any file the proxy can create: a
                # recording named ~/.bash_login or a cron/profile file would be read as
                # commands (its lines quote client-chosen text); a recording's own suffix is
                # read by nothing of the kind
                return json_error(400, "the recording's file name must end in .jsonl or "
                                       ".jsonl.gz")
            if current is not None:
                held = current.get("path", "?")
                if current.get("error"):  # (the screens say REC FAILED: "already recording"
                    return json_error(    # read as if it were writing)
                        409, f"the recording to {held} stopped writing "
                             f"({current['error']}); stop it first")
                return json_error(409, f"already recording to {held}; stop it first")
            return json_response(rec.start(path))
        if current is None:
            return json_error(409, "not recording")
        done = rec.stop()
        n = done.get("open_at_stop")
        if type(n) is int and n > 0:  # (its records never come: the recording ends low)
            done = {**done, "note": f"{n} request{' was' if n == 1 else 's were'} still "
                                    "open when the recording stopped; "
                                    f"{'it is' if n == 1 else 'they are'} not in it"}
        return json_response(done)
    except FileNotFoundError as exc:
        return json_error(404, f"no such directory for {exc.filename or 'the path'}")
    except PermissionError as exc:
        return json_error(403, f"permission denied: {exc.filename or exc}")
    except (ValueError, OSError) as exc:
        # retry_later: the file cannot be opened now (out of file descriptors), not a bad
        # request: 503, which a script may retry
        return json_error(503 if getattr(exc, "retry_later", False) else 400, _one_line(exc))


def _one_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    agg = ctx.aggregator
    rec = ctx.recording
    st = rec.status() if rec is not None else None
    failed = st.get("error") if st is not None else None
    return json_response({
        "status": "ok",
        "version": __version__,
        "time": agg.clock(),
        "uptime_s": max(0.0, agg.clock() - agg.started_at),
        "in_flight": len(ctx.active),
        "requests": agg.records_seen,
        # a recording that stopped writing (disk full, file deleted) is not recording:
        # a liveness probe said true until it was stopped by hand
        "recording": st is not None and failed is None,
        "recording_error": failed,
    })


def make_admin_app(ctx: AdminContext) -> web.Application:
    """The admin API as an aiohttp application (serve it on the admin address)."""
    app = web.Application(middlewares=[_guard])
    app[CTX] = ctx
    app[COLLECTOR] = LlmtopCollector(ctx.aggregator)
    app.router.add_get(PREFIX + "/snapshot", snapshot)
    app.router.add_get(PREFIX + "/requests", requests_)
    app.router.add_get(PREFIX + "/recording", recording_status)
    app.router.add_post(PREFIX + "/recording", recording_control)
    app.router.add_get(PREFIX + "/health", health)
    app.router.add_get("/metrics", metrics)
    return app
