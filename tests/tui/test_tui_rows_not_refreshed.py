"""The active requests when their fetch fails and the figures' does not (an older proxy's
separate ``/requests`` answering 500, stalling past the timeout or dropping the
connection; one of several attached proxies down): the rows last had stay on screen and
the panel says they were not refreshed, and an open request's modal says it could not
refresh — it had said "finished", and the panel had emptied as if nothing were open."""

from __future__ import annotations

import pytest
from test_tui_request_detail import WIDE, field, modal_text, open_modal, open_request
from textual.content import Content
from tui_support import FIXED_NOW, AdminServer, RealAdmin, until, until_fetched

from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.request_detail import RequestDetail
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.source import AdminSource, SourceUnavailable

# long enough that a loaded CI machine answers a working fetch in time (the first one, at
# mount, is the only one these apps make by themselves: refresh_hz=0), short enough that a
# stalled list times out soon
FETCH_TIMEOUT_S = 2.0

FAULTS = {"500": "HTTP 500 registry unavailable", "stall": "timed out",
          "reset": "server disconnected"}


def requests_title(app: LlmtopApp) -> str:
    """The requests panel's title, as text (the reason in the warning colour)."""
    return Content.from_markup(str(app.dashboard.requests.border_title or "")).plain


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_an_older_proxys_failed_list_keeps_its_rows_and_says_so(fault: str) -> None:
    """The snapshot arrives, the list does not: the ten rows stay, the panel's title says
    "not refreshed" and why, and the open request's modal says it could not refresh (not
    "finished"), with its last figures. The next list that arrives clears both."""
    srv = AdminServer("saturated")  # an older proxy: no rows in its snapshot
    await srv.start()
    src = AdminSource([srv.url], timeout_s=FETCH_TIMEOUT_S)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    try:
        async with app.run_test(size=WIDE) as pilot:
            await open_modal(pilot, app, rows=10)
            assert field(app, "llmtop id") == "r-4400"
            assert field(app, "state") == "waiting"
            refreshes = app.refreshes
            srv.requests_fault = fault
            assert await app.refresh_now()  # the figures came: connected
            assert app.connected and app.refreshes == refreshes + 1
            why = FAULTS[fault]
            await until(pilot, lambda: "could not refresh" in modal_text(app),
                        what="the modal saying it could not refresh")
            shown = modal_text(app)
            assert f"could not refresh ({why}) · its last figures" in shown, shown
            assert "finished" not in shown
            assert field(app, "state") == "waiting"
            assert isinstance(app.screen, RequestDetail)
            assert app.dashboard.requests.row_count == 10
            assert requests_title(app) == f"active requests · not refreshed: {why}"
            await pilot.press("escape")  # opened again, from the kept rows: said at once
            await until(pilot, lambda: app.screen is app.dashboard)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RequestDetail))
            await pilot.pause()
            assert f"could not refresh ({why})" in modal_text(app)

            srv.requests_fault = None
            srv.requests = [r for r in srv.requests if r["id"] != "r-4400"]
            assert await app.refresh_now()
            await until(pilot, lambda: field(app, "state") == "finished",
                        what="finished, once a list says so")
            assert "could not refresh" not in modal_text(app)
            assert app.dashboard.requests.row_count == 9
            assert requests_title(app) == "active requests"
    finally:
        await srv.stop()


async def test_disconnected_the_modal_and_the_panel_say_the_rows_are_old(
        admin: RealAdmin) -> None:
    """The proxy stops answering at all: the app is disconnected, and the open
    request's modal, which kept its figures without a word, says it could not refresh;
    so does the requests panel, whose rows are the last ones had. Back, both clear."""
    open_request(admin, "r-1", "alice", age_s=4)
    app = LlmtopApp(AdminSource([admin.url], timeout_s=FETCH_TIMEOUT_S), refresh_hz=0,
                    clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await open_modal(pilot, app)
        port = admin.url.rsplit(":", 1)[1]
        await admin.stop()
        assert not await app.refresh_now()
        assert not app.connected
        await until(pilot, lambda: "could not refresh" in modal_text(app),
                    what="the modal saying it could not refresh")
        assert "connection refused" in modal_text(app)
        assert field(app, "state") == "waiting"
        assert app.dashboard.requests.row_count == 1
        assert requests_title(app).startswith("active requests · not refreshed: ")

        await _start_on(admin, int(port))  # back, with the same registry
        assert await app.refresh_now()
        await until(pilot, lambda: "could not refresh" not in modal_text(app),
                    what="the mark gone once refreshed")
        assert field(app, "state") == "waiting"
        assert requests_title(app) == "active requests"


async def _start_on(admin: RealAdmin, port: int) -> None:
    """``admin`` serving again on ``port`` (the fixture stops it)."""
    from aiohttp import web

    from llmtop.admin.routes import make_admin_app

    admin._runner = web.AppRunner(make_admin_app(admin.ctx), access_log=None)
    await admin._runner.setup()
    await web.TCPSite(admin._runner, "127.0.0.1", port, reuse_address=True).start()


async def test_one_of_two_proxies_down_keeps_its_rows_and_the_others_go_on() -> None:
    """``attach`` to two proxies, one of which stops: its request's modal says it could
    not refresh (it had said "finished"), its row stays, the panel names the proxy; the
    other proxy's rows still refresh (a request that ends there is gone). The user's
    detail says it too."""
    a, b = RealAdmin(), RealAdmin()
    await a.start()
    await b.start()
    try:
        open_request(a, "r-a", "alice", age_s=9)
        open_request(a, "r-a2", "alice", age_s=8)
        open_request(b, "r-b", "bob", age_s=3).upstream_id = "engine-b-1"
        app = LlmtopApp(AdminSource([a.url, b.url], timeout_s=FETCH_TIMEOUT_S), refresh_hz=0,
                        clock=lambda: FIXED_NOW)
        async with app.run_test(size=WIDE) as pilot:
            await until_fetched(pilot, lambda: app.dashboard.requests.row_count == 3)
            await pilot.press("tab", "down", "down")  # oldest first: b's is the third
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RequestDetail))
            await pilot.pause()
            assert field(app, "engine id") == "engine-b-1"
            await b.stop()
            del a.active["r-a2"]
            assert await app.refresh_now()
            await until(pilot, lambda: "could not refresh" in modal_text(app),
                        what="the modal saying it could not refresh")
            assert "finished" not in modal_text(app)
            assert field(app, "engine id") == "engine-b-1"
            assert field(app, "state") == "waiting"
            ids = sorted(str(r.get("id")) for r in app.active)
            assert ids == ["r-a", "r-b"]  # a's ended request gone, b's kept
            assert app.dashboard.requests.row_count == 2
            title = requests_title(app)
            assert title.startswith(f"active requests · {b.url}'s not refreshed: "), title
            assert "connection refused" in title
            await pilot.press("escape")  # bob's detail: his request kept, and said so
            await until(pilot, lambda: app.screen is app.dashboard)
            app.open_user("bob")
            await until(pilot, lambda: isinstance(app.screen, UserDetail))
            detail = app.screen
            assert isinstance(detail, UserDetail)
            await until(pilot, lambda: detail.requests.row_count == 1, what="bob's row")
            title = Content.from_markup(str(detail.requests.border_title)).plain
            assert title == (f"active requests of bob · {b.url}'s not refreshed: "
                             "connection refused"), title
    finally:
        await a.stop()
        await b.stop()


async def test_the_source_keeps_a_failing_proxys_rows_and_names_it() -> None:
    """AdminSource over two older proxies, one of whose lists fails: the other's rows
    fresh, the failing one's last rows (not none), and ``stale_rows()`` naming it; with
    one proxy the failure is raised, not an empty list."""
    from test_tui_source import sum_merge

    a, b = AdminServer("low_load"), AdminServer("saturated")
    await a.start()
    await b.start()
    src = AdminSource([a.url, b.url], merge=sum_merge, timeout_s=FETCH_TIMEOUT_S)
    one = AdminSource([b.url], timeout_s=FETCH_TIMEOUT_S)
    try:
        await src.fetch(60)
        assert len(await src.active_requests()) == 13 and src.stale_rows() == {}
        b.requests_fault = "500"
        a.requests = a.requests[:1]
        await src.fetch(60)
        rows = await src.active_requests()
        assert [r["proxy"] for r in rows] == [a.url] + [b.url] * 10
        assert src.stale_rows() == {b.url: "HTTP 500 registry unavailable"}
        await one.fetch(60)
        with pytest.raises(SourceUnavailable, match="HTTP 500 registry unavailable"):
            await one.active_requests()
        b.requests_fault = None
        await src.fetch(60)
        assert len(await src.active_requests()) == 11 and src.stale_rows() == {}
    finally:
        await src.close()
        await one.close()
        await a.stop()
        await b.stop()
