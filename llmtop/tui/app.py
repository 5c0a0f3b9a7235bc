"""The Textual app: a refresh loop over a :class:`SnapshotSource` and the key bindings.

Thin on purpose: panels live in ``widgets/``, screens in ``screens/``, I/O in the source.
Fetching runs in a worker on a timer, so rendering never waits for the network; a source
that stops answering turns the header to "disconnected — retrying" until it answers again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Input

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.screens.dashboard import Dashboard
from llmtop.tui.screens.help import HelpScreen
from llmtop.tui.screens.record import RecordPrompt
from llmtop.tui.screens.request_detail import RequestDetail
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.snapview import WINDOWS, SnapView
from llmtop.tui.source import (
    HasNotes,
    ReplayControl,
    ReportsDown,
    ReportsStaleRows,
    SnapshotSource,
    SourceUnavailable,
)
from llmtop.tui.stale_rows import StaleRows
from llmtop.tui.widgets.header import HeaderStatus
from llmtop.tui.widgets.requests import RequestsTable

Clock = Callable[[], float]
SEEK_S = 10.0
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
DASHBOARD_ACTIONS = frozenset({"sort", "reverse_sort", "filter"})
REPLAY_ACTIONS = frozenset({"replay_pause", "seek", "speed"})
STOP_POLL_S = 0.2
"""How often the app looks at its ``stop`` event."""
NOTE_TIMEOUT_S = 30.0
"""How long the source's notes (``HasNotes``) stay on screen: long enough to be read once
the first figures have drawn the eye (Textual's default is 5 s); a click dismisses one."""


def proposed_recording_path(now: float) -> str:
    """``llmtop-YYYYmmdd-HHMMSS.jsonl.gz`` in local time: a bare file name, so it lands in
    the proxy's working directory (which exists) rather than a directory that may not."""
    return time.strftime("llmtop-%Y%m%d-%H%M%S.jsonl.gz", time.localtime(now))


class LlmtopApp(App[int]):
    """The live view. ``clock`` gives wall time for what is shown (proposed file names);
    ages and "since" figures are relative to each snapshot's own ``time``. ``monotonic``
    times the retries and how old the figures kept while disconnected are (tests give a
    clock of their own: on a busy machine a second can pass between two steps)."""

    CSS_PATH = "app.tcss"
    TITLE = "llmtop"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        # like top: Ctrl-C quits (Textual's own binding only tells you to press Ctrl-Q)
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("p", "pause", "pause"),
        Binding("w", "cycle_window", "window"),
        Binding("s", "sort", "sort"),
        Binding("S", "reverse_sort", "reverse sort", show=False),
        Binding("slash", "filter", "filter"),
        Binding("r", "record", "rec"),
        Binding("d", "toggle_dark", "theme"),
        Binding("space", "replay_pause", "play/pause", priority=True),
        Binding("left", "seek(-1)", "-10 s", priority=True),
        Binding("right", "seek(1)", "+10 s", priority=True),
        Binding("plus,equals_sign", "speed(1)", "faster", priority=True),
        Binding("minus", "speed(-1)", "slower", priority=True),
    ]

    def __init__(
        self,
        source: SnapshotSource,
        *,
        refresh_hz: float = 4.0,
        window_s: int | None = 60,
        title: str = "llmtop",
        proxy: str | None = None,
        admin: str | None = None,
        clock: Clock = time.time,
        monotonic: Clock = time.monotonic,
        retry_s: float = 1.0,
        stop: threading.Event | None = None,
    ) -> None:
        super().__init__()
        if window_s not in WINDOWS:
            raise ValueError(f"window must be one of 10, 60, 300 or all, not {window_s}")
        if refresh_hz < 0:
            raise ValueError("refresh rate must be ≥ 0 (0: only on demand)")
        self.source = source
        self.refresh_hz = refresh_hz
        self.window_s: int | None = window_s
        self.title = title
        self.proxy = proxy
        self.admin = admin
        self.clock = clock
        self._monotonic = monotonic
        self.retry_s = retry_s
        self.stop_event = stop
        """Set from another thread to end the app as ``q`` does (``run``/``demo``: the
        process serving the admin API died)."""
        self.paused = False
        self.connected = True
        self.error: str | None = None
        self.has_data = False
        self.replay_paused = False
        self.view = SnapView(None)
        self.active: list[Mapping[str, Any]] = []
        self.active_stale = StaleRows()
        """Which of :attr:`active` the last fetch could not refresh (kept, said so)."""
        self.palette = Palette()
        self.dashboard = Dashboard()
        self.refreshes = 0
        """Snapshots received so far (tests and screenshots wait on it)."""
        self._fetching = False
        self._fetch_id = 0
        self._last_attempt = float("-inf")
        self._last_data = float("-inf")
        self._recording: str | None = None
        self._record_busy = False
        """A recording start or stop is on its way to the proxy (a second r waits)."""
        self._replay_length: float | None = None
        self._started = 0
        self._applied = 0

    @property
    def replay(self) -> ReplayControl | None:
        src = self.source
        return src if isinstance(src, ReplayControl) else None

    # -- lifecycle ---------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return self.dashboard

    async def on_mount(self) -> None:
        self.palette = Palette.from_variables(self.get_css_variables(),
                                               no_color=self.no_color)
        self._show()
        if isinstance(self.source, HasNotes):
            for note in self.source.notes:
                self.notify(printable(note), title="note", severity="warning",
                            timeout=NOTE_TIMEOUT_S,
                            markup=False)
        if self.refresh_hz > 0:
            self.set_interval(1.0 / self.refresh_hz, self._tick)
        if self.stop_event is not None:
            self.set_interval(STOP_POLL_S, self._check_stop)
            self._check_stop()
        self._tick()

    def _check_stop(self) -> None:
        if self.stop_event is not None and self.stop_event.is_set():
            self.exit()

    async def on_unmount(self) -> None:
        try:
            await self.source.close()
        except Exception as exc:  # closing must never turn a clean quit into a traceback
            self.log.error(f"closing the source failed: {exc!r}")

    def _tick(self) -> None:
        if self.paused or self._fetching:
            return
        if not self.connected and self._monotonic() - self._last_attempt < self.retry_s:
            return
        self._fetch_now()

    @work(group="refresh", exclusive=True, exit_on_error=False)
    async def _refresh_worker(self, me: int) -> None:
        # exclusive: a new fetch (`w`) cancels the one in flight, so a hung request never
        # holds up the window asked for; only the latest fetch clears the flag
        try:
            await self.refresh_now(paused_too=False)
        finally:
            if me == self._fetch_id:
                self._fetching = False

    async def refresh_now(self, *, paused_too: bool = True) -> bool:
        """Fetch one snapshot (and the active requests) now and show it. Returns whether
        data arrived; a failure switches to the disconnected state instead of raising.
        ``paused_too=False`` (the timer's fetches): data that arrives once ``p`` has
        paused the display is not shown (a fetch on its way when p was pressed changed
        the figures after it), unless there is none on screen yet."""
        self._last_attempt = self._monotonic()
        self._started += 1
        ticket, window = self._started, self.window_s
        try:
            snap = await self.source.fetch(window)
        except Exception as exc:  # a source bug must not take the screen down either
            if ticket > self._applied:
                why = str(exc) if isinstance(exc, SourceUnavailable) else (
                    f"{type(exc).__name__}: {exc}")
                self._disconnected(why)
            return False
        active, stale = await self._active_requests()
        if ticket < self._applied or window != self.window_s:
            return False  # overtaken by a newer fetch (e.g. `w` during a timer fetch)
        if self.paused and not paused_too and self.has_data:
            return False  # paused while it was on its way: the figures stay as they were
        self._applied = ticket
        if not self.connected:
            self.notify("reconnected", severity="information", markup=False)
        self.connected, self.error, self.has_data = True, None, True
        self._last_data = self._monotonic()
        self.view, self.active, self.active_stale = SnapView(snap), active, stale
        self.refreshes += 1
        self._show()
        return True

    async def _active_requests(self) -> tuple[list[Mapping[str, Any]], StaleRows]:
        """The active requests, and which of them are not the latest: when they cannot be
        had the rows on screen stay, marked, for an empty list would say that no request
        is open (and an open request's modal that it has finished)."""
        try:
            active: list[Mapping[str, Any]] = list(await self.source.active_requests())
        except Exception as exc:  # a source bug as well: the figures still show
            why = str(exc) if isinstance(exc, SourceUnavailable) else (
                f"{type(exc).__name__}: {exc}")
            return list(self.active), StaleRows(everything=_first_line(why))
        if isinstance(self.source, ReportsStaleRows):
            return active, StaleRows.of_proxies(self.source.stale_rows())
        return active, StaleRows()

    def rows_stale(self) -> StaleRows:
        """Which active rows on screen are not the latest: all of them while
        disconnected (they are the last ones had), else what the last fetch said."""
        if not self.connected:
            return StaleRows(everything=self.error or "no answer")
        return self.active_stale

    def _disconnected(self, why: str) -> None:
        first_line = _first_line(why)
        if self.connected:
            self.notify(f"disconnected: {first_line}", severity="warning", markup=False)
        self.connected, self.error = False, first_line
        self._show()

    def shown_window(self) -> int | None:
        """The window of the figures on screen: the snapshot's own ``window_s`` (one
        source of truth: after `w` while paused or while a fetch is on its way, it is not
        yet :attr:`window_s`, the window asked for); before any data, the one asked for."""
        raw = self.view.raw
        if "window_s" not in raw:
            return self.window_s
        if raw["window_s"] is None:
            return None  # the whole session
        w = self.view.window_s
        return self.window_s if w is None else w

    def status(self) -> HeaderStatus:
        shown = self.shown_window()
        down = self.source.down_label() if isinstance(self.source, ReportsDown) else None
        return HeaderStatus(
            source=self._source_label(),
            window_s=shown,
            window_pending=shown != self.window_s,
            asked_window_s=self.window_s,
            down=down,
            paused=self.paused,
            paused_at=self.view.time if self.paused and self.has_data else None,
            connected=self.connected,
            error=self.error,
            has_data=self.has_data,
            replay=self._replay_label(),
            proxy=self.proxy,
            admin=self.admin,
            stale_s=None if self.connected or not self.has_data else int(
                self._monotonic() - self._last_data),
        )

    def _source_label(self) -> str:
        """Where the data comes from. A replay says only its file here: the position,
        length and speed are in the replay label, once."""
        if self.replay is None:  # (an attached proxy's error is in it)
            return printable(self.source.describe())
        path = getattr(self.source, "path", None)
        name = self.view.text("replay", "file") or getattr(path, "name", None)
        return printable(name if isinstance(name, str) and name else self.source.describe())

    def _replay_label(self) -> str | None:
        rp = self.replay
        if rp is None:
            return None
        dur = rp.duration_s
        if dur is not None:
            self._replay_length = dur
        else:  # a gzipped recording's length is unknown again after seeking back
            dur = self._replay_length
        pos = fmt.duration(rp.position_s)
        where = pos if dur is None else f"{pos}/{fmt.duration(dur)}"
        if self._replay_at_end(rp):
            return f"■ replay ended {where} ×{rp.speed:g}"
        state = "⏸ " if self._replay_is_paused(rp) else "▶ "
        return f"{state}replay {where} ×{rp.speed:g}"

    def _show(self) -> None:
        status, stale = self.status(), self.rows_stale()
        for screen in self.screen_stack:
            if isinstance(screen, Dashboard | UserDetail):
                screen.apply(self.view, self.palette, self.active, status, stale=stale)
            elif isinstance(screen, RequestDetail):
                screen.follow(self.active, self.palette, stale)

    # -- keys --------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in REPLAY_ACTIONS:
            # not behind the help either: its keys are the help's (space scrolls it), and
            # its footer does not offer them (these are priority bindings, which Textual
            # runs even under a modal screen)
            return (self.replay is not None and not isinstance(self.focused, Input)
                    and not isinstance(self.screen, HelpScreen))
        if action in DASHBOARD_ACTIONS:
            return self.screen is self.dashboard
        if action == "record":  # a replay cannot record
            return self.replay is None
        return True

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._show()
        if not self.paused and self.shown_window() != self.window_s:
            self._fetch_now()  # `w` while paused: that window's figures at once

    def action_cycle_window(self) -> None:
        """Ask for the next window. Nothing here waits for the network (an admin API that
        hangs must not freeze the keys): the header shows "→ 5 min…" until a background
        fetch brings that window's figures; paused, it waits for the resume."""
        i = WINDOWS.index(self.window_s) if self.window_s in WINDOWS else 0
        self.window_s = WINDOWS[(i + 1) % len(WINDOWS)]
        self._show()
        if not self.paused:
            self._fetch_now()

    def _fetch_now(self) -> None:
        """Start a fetch at once, in place of any still on its way (a hung one included)."""
        self._fetching = True
        self._fetch_id += 1
        self._refresh_worker(self._fetch_id)

    def action_sort(self) -> None:
        self.dashboard.users.cycle_sort()

    def action_reverse_sort(self) -> None:
        self.dashboard.users.reverse_sort()

    def action_filter(self) -> None:
        self.dashboard.open_filter()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(replay=self.replay is not None,
                                        no_color=self.no_color,
                                        detail=isinstance(self.screen, UserDetail)))

    def action_toggle_dark(self) -> None:
        self.theme = "textual-dark" if self.theme == "textual-light" else "textual-light"
        self.palette = Palette.from_variables(self.get_css_variables(),
                                               no_color=self.no_color)
        self._show()

    def on_dashboard_user_selected(self, message: Dashboard.UserSelected) -> None:
        self.open_user(message.user)

    def on_requests_table_request_selected(
            self, message: RequestsTable.RequestSelected) -> None:
        """``enter`` on an active request (the dashboard's table or a user's detail): its
        fields, from the rows already fetched, following it as they refresh."""
        self.push_screen(RequestDetail(message.row, self.palette, self.rows_stale()))

    def open_user(self, user: str) -> None:
        """Push the detail screen for ``user`` and fill it from the latest snapshot."""
        screen = UserDetail(user)
        self.push_screen(screen)
        screen.apply(self.view, self.palette, self.active, self.status(),
                     stale=self.rows_stale())

    # -- recording -------------------------------------------------------------------------

    @property
    def recording_active(self) -> bool:
        if "recording" in self.view.raw:
            return self.view.recording_path is not None
        return self._recording is not None

    def action_record(self) -> None:
        if self._record_busy:  # the last start/stop is still on its way to the proxy
            self.notify("waiting for the proxy's answer to the last r", title="recording",
                        markup=False)
            return
        if self.recording_active:
            self._record_busy = True
            self._record("stop", None)
            return

        self._ask_path(proposed_recording_path(self.clock()))

    def _ask_path(self, proposed: str, problem: str | None = None) -> None:
        """The prompt over the screen on top now (the dashboard or a user's detail), which
        is where it comes back after a refusal."""
        origin = self.screen

        def chosen(path: str | None) -> None:
            if path:
                self._record_busy = True
                self._record("start", path, origin)

        self.push_screen(RecordPrompt(proposed, problem=problem), chosen)

    @work(group="recording", exit_on_error=False)
    async def _record(self, action: str, path: str | None,
                      origin: Screen[Any] | None = None) -> None:
        try:
            await self._record_once(action, path, origin)
        finally:
            self._record_busy = False

    async def _record_once(self, action: str, path: str | None,
                           origin: Screen[Any] | None = None) -> None:
        try:
            reply = await self.source.recording(action, path)
        except Exception as exc:
            why = _first_line(str(exc) if isinstance(exc, SourceUnavailable) else (
                f"{type(exc).__name__}: {exc}"))
            self.notify(why, title="recording", severity="error", markup=False)
            if action == "start" and path and origin is not None and self.screen is origin:
                # the prompt again, with the name typed and the reason (a bad suffix, a
                # missing directory): a notification alone goes in seconds, the name with
                # it. Over the screen r was pressed on (the dashboard or a user's detail),
                # while it is still on top: not over one the reader has gone to since.
                self._ask_path(path, problem=why)
            return
        if action == "start":
            self._recording = _reply_path(reply) or path
            self.notify(f"recording to {self._recording}", title="recording", markup=False)
        else:
            self._recording = None
            # (requests open at the stop are never written: the recording ends low)
            n = reply.get("open_at_stop")
            left = (f"; {n} request{'' if n == 1 else 's'} still open "
                    f"{'was' if n == 1 else 'were'} left out of it"
                    if type(n) is int and n > 0 else "")
            self.notify("recording stopped" + left, title="recording", markup=False)
        if self.paused and self.has_data:
            await self._refresh_recording_state()
        else:
            await self.refresh_now()

    async def _refresh_recording_state(self) -> None:
        """Paused: the proxy's word on the recording (the header's ● REC, FAILED or SHARED,
        and what the next r does: start or stop) from a fresh snapshot, put into the one
        on screen; its figures stay as paused (QA: r while paused replaced them all, and
        the paused view moved on). When no snapshot can be had, what the reply said."""
        raw = dict(self.view.raw)
        try:
            snap = await self.source.fetch(self.window_s)
            raw["recording"] = snap["recording"]
        except Exception:  # (the figures stay; the proxy's reply said what it did)
            raw["recording"] = ({"status": "recording", "path": self._recording}
                                if self._recording is not None else None)
        self.view = SnapView(raw)
        self._show()

    # -- replay ----------------------------------------------------------------------------

    def _replay_at_end(self, rp: ReplayControl) -> bool:
        """Whether the replay has played everything: the source's ``at_end`` when it has
        one, else the snapshot's ``replay.at_end``."""
        at_end = getattr(rp, "at_end", None)
        if isinstance(at_end, bool):
            return at_end
        return self.view.mapping("replay").get("at_end") is True

    def _replay_is_paused(self, rp: ReplayControl) -> bool:
        """The source's own ``paused`` flag when it has one, else what the keys did."""
        paused = getattr(rp, "paused", None)
        return paused if isinstance(paused, bool) else self.replay_paused

    def action_replay_pause(self) -> None:
        rp = self.replay
        if rp is None:
            return
        if self._replay_is_paused(rp):
            rp.resume()
            self.replay_paused = False
        else:
            rp.pause()
            self.replay_paused = True
        self._show()

    async def action_seek(self, direction: int) -> None:
        rp = self.replay
        if rp is None:
            return
        rp.seek(SEEK_S * (1 if direction > 0 else -1))
        await self.refresh_now()

    def action_speed(self, direction: int) -> None:
        rp = self.replay
        if rp is None:
            return
        current = rp.speed
        if direction > 0:
            faster = [s for s in SPEEDS if s > current]
            rp.speed = faster[0] if faster else SPEEDS[-1]
        else:
            slower = [s for s in SPEEDS if s < current]
            rp.speed = slower[-1] if slower else SPEEDS[0]
        self._show()


def _first_line(why: str) -> str:
    """The first line of an error, printable: its text comes from whatever answered at
    the admin address (an error reply's own words), escape sequences and all."""
    return printable(why.splitlines()[0]) if why.strip() else "no answer"


def _reply_path(reply: Mapping[str, Any]) -> str | None:
    p = reply.get("path")
    return printable(p) if isinstance(p, str) and p else None


def run_tui(
    source: SnapshotSource,
    *,
    refresh_hz: float = 4.0,
    window_s: int | None = 60,
    title: str = "llmtop",
    proxy: str | None = None,
    admin: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run the TUI on ``source`` until the user quits (or ``stop`` is set, from any
    thread); returns the exit code (0).
    The app closes the source when it exits. Used by ``attach``, ``run``, ``replay``
    and ``demo``; ``proxy`` and ``admin`` (the addresses of the proxy ``run`` or ``demo``
    started) are named in the header."""
    app = LlmtopApp(source, refresh_hz=refresh_hz, window_s=window_s, title=title, proxy=proxy,
                    admin=admin, stop=stop)
    app.run()
    return int(app.return_code or 0)

