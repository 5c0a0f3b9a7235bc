"""Test helpers for the TUI: a fixture-backed source (in memory), a real admin-API
server on 127.0.0.1 port 0 serving the same fixtures, and screen reading for pilots."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from llmtop.admin import AGE_HEADER
from llmtop.admin.routes import AdminContext, make_admin_app
from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.writer import RecordingController
from llmtop.tui.source import SourceUnavailable

FIXTURES = Path(__file__).parent / "fixtures"
FIXED_NOW = 1796000000.0
"""The fixtures' snapshot time; the injected clock for tests."""


def fixture(name: str) -> dict[str, Any]:
    """``{"snapshot": ..., "requests": [...]}`` from tests/tui/fixtures/<name>.json."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    return data


class FixtureSource:
    """A SnapshotSource that answers from a fixture file, in memory. Records what the app
    asked for; ``down`` makes it raise SourceUnavailable like an unreachable proxy."""

    def __init__(self, name: str = "saturated") -> None:
        data = fixture(name)
        self.snapshot: dict[str, Any] = data["snapshot"]
        self.requests: list[dict[str, Any]] = data["requests"]
        self.windows: list[int | None] = []
        self.recording_calls: list[tuple[str, str | None]] = []
        self.down = False
        self.closed = False

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        self.windows.append(window_s)
        if self.down:
            raise SourceUnavailable("fixture source is down")
        snap = copy.deepcopy(self.snapshot)
        snap["window_s"] = window_s
        return snap

    async def active_requests(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.requests)

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        self.recording_calls.append((action, path))
        if action == "start":
            self.snapshot["recording"] = {"status": "recording", "path": path}
            return {"status": "recording", "path": path}
        self.snapshot["recording"] = None
        return {"status": "stopped"}

    def describe(self) -> str:
        return "fixture"

    async def close(self) -> None:
        self.closed = True


class ReplayFixtureSource(FixtureSource):
    """A FixtureSource that also implements ReplayControl (pause, seek, speed)."""

    def __init__(self, name: str = "saturated") -> None:
        super().__init__(name)
        self.speed = 1.0
        self.position = 60.0
        self.paused = False
        self.seeks: list[float] = []

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def seek(self, delta_s: float) -> None:
        self.seeks.append(delta_s)
        self.position = max(0.0, self.position + delta_s)

    @property
    def position_s(self) -> float:
        return self.position

    @property
    def duration_s(self) -> float | None:
        return 300.0

    def describe(self) -> str:
        return "demo.jsonl"


class AdminServer:
    """A real aiohttp server with the admin API's snapshot, requests and recording routes,
    answering from a fixture. It can be stopped and started again on the same port."""

    def __init__(self, name: str = "saturated", token: str = "") -> None:
        data = fixture(name)
        self.snapshot: dict[str, Any] = data["snapshot"]
        self.requests: Any = data["requests"]
        self.token = token
        self.windows: list[str | None] = []
        self.queries: list[dict[str, str]] = []
        self.auth: list[str | None] = []
        self.recording_bodies: list[dict[str, Any]] = []
        self.raw_reply: str | None = None
        """When set, the snapshot route answers exactly this text."""
        self.snapshot_delay_s = 0.0
        """How long the snapshot route waits before it answers (a proxy that never
        answers: longer than the client's timeout). It answers the snapshot as it was
        when asked; stopping the server ends the wait."""
        self.age_s: float | None = None
        """When set, the snapshot's age the route says (``X-Llmtop-Age``): a source with
        ``max_age_s`` keeps it."""
        self.requests_fault: str | None = None
        """How the requests route fails, when set: ``"500"`` (an error reply),
        ``"stall"`` (no answer for a minute) or ``"reset"`` (the connection closed
        without an answer). The snapshot route still answers."""
        self.requests_asked = 0
        self._stop = asyncio.Event()
        """Set by :meth:`stop`: a stalled answer ends then (stopping waits for it)."""
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _authorised(self, request: web.Request) -> bool:
        self.auth.append(request.headers.get("Authorization"))
        return not self.token or request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _snapshot(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "unauthorised"}, status=401)
        window = request.query.get("window")
        self.windows.append(window)
        self.queries.append(dict(request.query))
        if self.raw_reply is not None:
            return web.Response(text=self.raw_reply, content_type="application/json")
        snap = copy.deepcopy(self.snapshot)
        snap["window_s"] = None if window == "all" else int(window or 60)
        if self.snapshot_delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.snapshot_delay_s)
        headers = {} if self.age_s is None else {AGE_HEADER: f"{self.age_s:g}"}
        return web.json_response(snap, headers=headers)

    async def _requests(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "unauthorised"}, status=401)
        self.requests_asked += 1
        if self.requests_fault == "500":
            return web.json_response({"error": "registry unavailable"}, status=500)
        if self.requests_fault == "reset" and request.transport is not None:
            request.transport.abort()
        if self.requests_fault in ("stall", "reset"):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 60)
        return web.json_response(self.requests)

    async def _recording(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.recording_bodies.append(body)
        if body.get("action") == "start":
            if not str(body.get("path", "")).endswith((".jsonl", ".jsonl.gz")):
                return web.Response(status=400, text="path must end in .jsonl or .jsonl.gz")
            self.snapshot["recording"] = {"status": "recording", "path": body["path"]}
            return web.json_response({"status": "recording", "path": body["path"]})
        self.snapshot["recording"] = None
        return web.json_response({"status": "stopped"})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/llmtop/v1/snapshot", self._snapshot)
        app.router.add_get("/llmtop/v1/requests", self._requests)
        app.router.add_post("/llmtop/v1/recording", self._recording)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._stop = asyncio.Event()


class RealAdmin:
    """The real admin API (aggregator, recording controller, routes) on 127.0.0.1 port 0,
    fed :class:`RequestRecord` events through a real bus — what ``llmtop run`` serves.
    Its clock is ``now`` (settable); relative recording paths land in the process's
    working directory, as they do in the proxy."""

    def __init__(self, cfg: Config | None = None) -> None:
        self.now = FIXED_NOW
        self.bus = EventBus()
        self.active: dict[str, ActiveRequest] = {}
        self.aggregator = Aggregator(cfg or Config(), self.active, clock=lambda: self.now,
                                     upstream="http://up:1")
        self.bus.subscribe(self.aggregator.on_events)
        self.recorder = RecordingController(self.bus, header={"upstream": "http://up:1",
                                                              "slo": {}})
        self.ctx = AdminContext(aggregator=self.aggregator, active=self.active,
                                recording=self.recorder,
                                extra_info={"upstream": "http://up:1"})
        self.url = ""
        self._runner: web.AppRunner | None = None

    def request(self, i: int, user: str, *, ttft_s: float = 0.2, tokens: int = 10) -> None:
        """One finished streamed request from ``user`` (``tokens`` chunks 20 ms apart)."""
        offs = tuple(ttft_s + 0.02 * k for k in range(tokens))
        self.bus.publish(RequestRecord(
            f"r{i}", user, "m", "openai", "/v1/chat/completions", True, 200, "ok",
            self.now - offs[-1], ttft_s, offs[-1], 10, tokens, "usage", offs, (1,) * tokens, 1))
        self.bus.drain()

    async def start(self) -> None:
        self._runner = web.AppRunner(make_admin_app(self.ctx), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.recorder.status() is not None:
            self.recorder.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def screen_text(app: App[Any]) -> str:
    """What the terminal shows now, as plain text (one line per row)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      force_terminal=True, color_system="truecolor", legacy_windows=False,
                      safe_box=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    return console.export_text()


async def until(pilot: Pilot[Any], cond: Callable[[], bool], limit_s: float = 20.0,
                what: str = "condition") -> None:
    """Let the app run until ``cond()`` holds; fail after ``limit_s`` seconds."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def shows(pilot: Pilot[Any], text: str, limit_s: float = 20.0) -> None:
    """Wait until ``text`` is on screen."""
    await until(pilot, lambda: text in screen_text(pilot.app), limit_s, f"{text!r} on screen")


async def until_fetched(pilot: Pilot[Any], cond: Callable[[], bool], limit_s: float = 20.0,
                        what: str = "condition") -> None:
    """:func:`until` for the first data of an app made with ``refresh_hz=0`` on a real
    admin server. Such an app fetches by itself once, at mount; when that fetch fails (a
    loaded machine past the source's timeout: stop 45's CI) nothing fetches again and the
    wait times out. So fetch here too, every half second while ``cond()`` does not hold
    and no fetch is on its way (the same data again: harmless to what the test asks)."""
    app: Any = pilot.app
    deadline = time.monotonic() + limit_s
    next_fetch = time.monotonic() + 0.5
    while not cond():
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out waiting for {what} "
                                 f"(last error {getattr(app, 'error', None)!r})")
        if now > next_fetch and not busy_workers(app, "refresh"):
            await app.refresh_now()
            next_fetch = time.monotonic() + 0.5
        await pilot.pause(0.02)


def busy_workers(app: App[Any], group: str) -> list[Any]:
    """The app's workers of ``group`` not finished yet ("refresh": a fetch on its way;
    "recording": a recording start or stop on its way to the proxy)."""
    return [w for w in app.workers if w.group == group and not w.is_finished]


def focused_row(app: App[Any]) -> int | None:
    """The cursor row of the focused table (None when no table has the focus)."""
    from textual.widgets import DataTable

    focused = app.focused
    return focused.cursor_row if isinstance(focused, DataTable) else None


async def after_keys(pilot: Pilot[Any], cond: Callable[[], bool], what: str) -> None:
    """Wait until keys just pressed have done what ``cond`` says, and for any scrolling
    they started to end: the screen as the keys left it."""
    await until(pilot, cond, what=what)
    await pilot.wait_for_scheduled_animations()


def prompt_ready(app: App[Any]) -> bool:
    """Whether the recording prompt is open with its path box focused (keys typed now go
    to the box: enter submits it)."""
    from llmtop.tui.screens.record import RecordPrompt

    screen = app.screen
    return isinstance(screen, RecordPrompt) and app.focused is screen.query_one("#record-path")


async def prompt_open(pilot: Pilot[Any], limit_s: float = 20.0) -> None:
    """Wait until the recording prompt is open and its path box has the focus."""
    await until(pilot, lambda: prompt_ready(pilot.app), limit_s, "the recording prompt")
