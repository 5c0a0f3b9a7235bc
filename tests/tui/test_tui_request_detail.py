"""`enter` on an active request: a modal with every field its row carries, the engine's
own id of it (``upstream_id``) among them — over llmtop's real admin API (a real
aggregator's rows on a socket), two of them attached at once, and a real replay."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.containers import VerticalScroll
from textual.pilot import Pilot
from tui_support import FIXED_NOW, RealAdmin, screen_text, until, until_fetched

from llmtop.events import ActiveRequest, RequestRecord
from llmtop.recording.replay import ReplaySource
from llmtop.textsafe import printable
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.help import HelpScreen
from llmtop.tui.screens.request_detail import RequestDetail
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.source import AdminSource

WIDE = (160, 48)


def open_request(admin: RealAdmin, rid: str, user: str, *, age_s: float,
                 model: str = "m-8b", concurrency: int = 7) -> ActiveRequest:
    """A request open in the proxy's registry for ``age_s`` seconds, no token yet."""
    a = ActiveRequest(rid, user, model, "openai", "/v1/chat/completions", True,
                      admin.now - age_s, time.perf_counter_ns() - int(age_s * 1e9),
                      concurrency_at_start=concurrency)
    admin.active[rid] = a
    return a


def modal_text(app: LlmtopApp) -> str:
    """What the request's modal shows: the screen cut to its box."""
    assert isinstance(app.screen, RequestDetail)
    r = app.screen.query_one(VerticalScroll).region
    lines = screen_text(app).splitlines()[r.y:r.y + r.height]
    return "\n".join(line[r.x:r.x + r.width] for line in lines)


def field(app: LlmtopApp, label: str) -> str:
    """One field's value as the modal shows it."""
    for line in modal_text(app).splitlines():
        body = line.strip("│ ")
        if body.startswith(label + "  "):
            return body[len(label):].strip()
    raise AssertionError(f"no {label!r} in the modal:\n{modal_text(app)}")


async def open_modal(pilot: Pilot[Any], app: LlmtopApp, rows: int = 1) -> None:
    """Tab to the dashboard's active requests and press enter on the first row."""
    await until_fetched(pilot, lambda: app.dashboard.requests.row_count == rows,
                        what=f"the requests' {rows} rows")
    await pilot.press("tab")
    assert app.focused is app.dashboard.requests
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, RequestDetail),
                what="the request's modal")
    await pilot.pause()


async def test_enter_on_a_request_shows_its_engine_id_follows_it_and_says_finished(
        admin: RealAdmin) -> None:
    """The operator's case: a request stuck "waiting"; enter shows its fields, the engine
    id "not named yet"; the next refreshes bring the id (the response head named it), its
    first token and tokens; when it ends the modal stays, says "finished" and keeps the
    last figures (the id to grep for) instead of closing; escape closes it."""
    a = open_request(admin, "r-stuck", "alice", age_s=40)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await open_modal(pilot, app)
        assert field(app, "llmtop id") == "r-stuck"
        assert field(app, "engine id") == "not named yet"
        assert field(app, "user") == "alice"
        assert field(app, "model") == "m-8b"
        assert field(app, "path") == "/v1/chat/completions"
        assert field(app, "dialect") == "openai"
        assert field(app, "stream") == "yes"
        assert field(app, "state") == "waiting"
        assert field(app, "TTFT") == "waiting"
        assert field(app, "status") == "not sent yet"
        assert field(app, "concurrency at start") == "7"
        assert field(app, "started") == time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(admin.now - 40))
        age = float(field(app, "age").removesuffix(" s"))
        assert 40 <= age < 100

        a.status, a.upstream_id = 200, "chatcmpl-9f1c2e77"
        a.first_token_ns = a.t0_ns + 41 * 10**9
        a.last_chunk_ns, a.chunks, a.tokens = a.first_token_ns, 3, 12
        assert await app.refresh_now()
        await until(pilot, lambda: field(app, "engine id") == "chatcmpl-9f1c2e77",
                    what="the engine's id once named")
        assert field(app, "state") == "streaming"
        assert field(app, "status") == "200"
        assert field(app, "TTFT") == "41.0 s"
        assert field(app, "tokens so far") == "12"
        assert float(field(app, "age").removesuffix(" s")) >= age

        del admin.active["r-stuck"]
        assert await app.refresh_now()
        await until(pilot, lambda: field(app, "state") == "finished", what="finished")
        assert isinstance(app.screen, RequestDetail)
        assert "finished · its last figures" in modal_text(app)
        assert field(app, "engine id") == "chatcmpl-9f1c2e77"
        assert field(app, "tokens so far") == "12"
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard, what="back")


async def test_a_request_that_ends_unnamed_says_none(admin: RealAdmin) -> None:
    """An engine that never named the request: "not named yet" while open, "none" once
    it has ended (it can no longer be named); q closes the modal, not the app."""
    open_request(admin, "r-anon", "bob", age_s=3)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await open_modal(pilot, app)
        assert field(app, "engine id") == "not named yet"
        admin.active.clear()
        assert await app.refresh_now()
        await until(pilot, lambda: field(app, "engine id") == "none", what="none")
        assert field(app, "state") == "finished"
        await pilot.press("q")  # the modal's q closes it; it does not quit the app
        await until(pilot, lambda: app.screen is app.dashboard, what="closed")
        assert app.is_running


async def test_hostile_strings_in_the_modal_are_shown_not_interpreted(
        admin: RealAdmin) -> None:
    """User, model and the engine's id come from clients and upstreams: ESC sequences and
    BEL shown as visible escapes, the right-to-left override dropped, Rich markup shown as
    written (a ``[bold]`` that vanished would mean it was interpreted)."""
    user = "[bold]eve\x1b]52;c;QUJD\x07\u202eresu"
    model = "[red]m[/red]\x1b[2J"
    uid = "[link=http://x]id[/link]\x1b]0;pwned\x07\u202edi"
    a = open_request(admin, "r-evil", user, age_s=2, model=model)
    a.upstream_id = uid
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await open_modal(pilot, app)
        assert field(app, "user") == printable(user) == "[bold]eve\\x1b]52;c;QUJD\\x07resu"
        assert field(app, "model") == "[red]m[/red]\\x1b[2J"
        assert field(app, "engine id") == "[link=http://x]id[/link]\\x1b]0;pwned\\x07di"
        shown = modal_text(app)
        assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown


async def test_enter_in_a_users_detail_opens_the_request_and_users_enter_still_drills_in(
        admin: RealAdmin) -> None:
    """Enter on the users table still opens the user's detail (not a request); there,
    enter on one of their requests opens its modal; escape goes back to the detail."""
    open_request(admin, "r-a1", "alice", age_s=5).upstream_id = "chatcmpl-alice-1"
    open_request(admin, "r-b1", "bob", age_s=4).upstream_id = "chatcmpl-bob-1"
    admin.request(1, "alice")
    admin.request(2, "bob")
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == 2, what="two users")
        assert app.focused is app.dashboard.users
        users = app.dashboard.users
        row = next(i for i in range(users.row_count)
                   if users.user_for(users.coordinate_to_cell_key((i, 0)).row_key) == "bob")
        users.move_cursor(row=row)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, UserDetail), what="bob's detail")
        detail = app.screen
        assert isinstance(detail, UserDetail) and detail.user == "bob"
        await until(pilot, lambda: detail.requests.row_count == 1, what="bob's request")
        assert app.focused is detail.requests
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RequestDetail), what="the modal")
        await pilot.pause()
        assert field(app, "engine id") == "chatcmpl-bob-1"
        assert field(app, "user") == "bob"
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is detail, what="back to the detail")


async def test_the_footer_and_the_help_name_the_request_key(admin: RealAdmin) -> None:
    """The active requests table's footer offers enter ("request"); the help lists it on
    the dashboard and in a user's detail (where enter on a user does not apply)."""
    open_request(admin, "r-1", "alice", age_s=2)
    app = LlmtopApp(AdminSource([admin.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.dashboard.requests.row_count == 1)
        await pilot.press("tab")
        await until(pilot, lambda: "⏎ request" in screen_text(app).splitlines()[-1],
                    what="the footer's enter")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        text = " ".join(screen_text(app).split())
        assert "on an active request: its fields, the engine's id among them" in text
        assert "that user's detail" in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.dashboard)
        app.open_user("alice")
        await until(pilot, lambda: isinstance(app.screen, UserDetail))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        text = " ".join(screen_text(app).split())
        assert "on an active request: its fields, the engine's id among them" in text
        assert "that user's detail" not in text


async def test_attached_to_two_proxies_the_modal_follows_its_proxys_request() -> None:
    """``attach`` to two proxies: both have a request "r-1" (ids are per proxy). The
    modal of the second proxy's names that proxy and its engine's id, and keeps following
    that one — not the other proxy's "r-1" — as they refresh."""
    a, b = RealAdmin(), RealAdmin()
    await a.start()
    await b.start()
    try:
        open_request(a, "r-1", "alice", age_s=9).upstream_id = "engine-a-1"
        rb = open_request(b, "r-1", "alice", age_s=3)
        rb.upstream_id = "engine-b-1"
        app = LlmtopApp(AdminSource([a.url, b.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=WIDE) as pilot:
            await until(pilot, lambda: app.dashboard.requests.row_count == 2)
            await pilot.press("tab")
            await pilot.press("down")  # oldest first: the second row is b's
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RequestDetail))
            await pilot.pause()
            assert field(app, "engine id") == "engine-b-1"
            assert field(app, "proxy") == b.url
            rb.first_token_ns, rb.tokens, rb.chunks = rb.t0_ns + 10**9, 33, 4
            assert await app.refresh_now()
            await until(pilot, lambda: field(app, "tokens so far") == "33", what="b's tokens")
            assert field(app, "engine id") == "engine-b-1"
            del b.active["r-1"]  # a's r-1 is still open: b's has ended all the same
            assert await app.refresh_now()
            await until(pilot, lambda: field(app, "state") == "finished", what="finished")
            assert field(app, "engine id") == "engine-b-1"
    finally:
        await a.stop()
        await b.stop()


class Wall:
    """The replay's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def recording_with_a_long_stream(path: Path) -> None:
    """A 40-token stream over 40 s whose engine named it "chatcmpl-replay-7", then a
    short request 60 s later (so the replay goes on past the long one's end)."""
    admin = RealAdmin()
    admin.now = time.time()  # the reader drops events a day before the header's start
    admin.recorder.start(str(path))
    t0 = admin.now
    offs = tuple(1.0 + k for k in range(40))
    admin.bus.publish(RequestRecord(
        "r-long", "carol", "m-8b", "openai", "/v1/chat/completions", True, 200, "ok",
        t0, 1.0, offs[-1], 321, 40, "usage", offs, (1,) * 40, 5,
        upstream_id="chatcmpl-replay-7"))
    admin.now = t0 + 60
    admin.request(1, "dave")
    admin.bus.drain()
    admin.recorder.stop()


async def test_a_replays_request_shows_its_engine_id_and_ends(tmp_path: Path) -> None:
    """In ``replay`` the active rows are rebuilt from the recording, the engine's id with
    them: the modal shows it mid-stream, its tokens move with the replay, and once the
    replay is past its end it says "finished"."""
    path = tmp_path / "long.jsonl"
    recording_with_a_long_stream(path)
    wall = Wall()
    app = LlmtopApp(ReplaySource(path, wall=wall), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        wall.t += 5.5
        assert await app.refresh_now()
        await open_modal(pilot, app)
        assert field(app, "engine id") == "chatcmpl-replay-7"
        assert field(app, "user") == "carol"
        assert field(app, "prompt tokens") == "321"
        assert field(app, "concurrency at start") == "5"
        before = int(field(app, "tokens so far"))
        assert 1 <= before < 40
        wall.t += 10
        assert await app.refresh_now()
        await until(pilot, lambda: int(field(app, "tokens so far")) > before,
                    what="tokens moving with the replay")
        wall.t += 40
        assert await app.refresh_now()
        await until(pilot, lambda: field(app, "state") == "finished", what="finished")
        assert field(app, "engine id") == "chatcmpl-replay-7"

