"""The admin API over a real aiohttp server on 127.0.0.1 (port 0)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from admin_support import T0, FedAggregator, admin_servers, record
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmtop.admin.routes import AdminContext, make_admin_app
from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import Aggregator


def rec(i: int, user: str) -> RequestRecord:
    return record(i, user, chunks=10, t_start=T0)


class Server:
    def __init__(self, url: str, ctx: AdminContext, bus: EventBus) -> None:
        self.url = url
        self.ctx = ctx
        self.bus = bus


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., Any]]:
    async with admin_servers() as servers:

        async def start(token: str = "", recorder: bool = True) -> Server:
            fed = FedAggregator(recording=recorder)
            ctx = fed.context(admin_token=token,
                              extra_info={"llmtop_version": "test", "upstream": "http://up:1"})
            url = await servers.serve(ctx)
            fed.publish(*(rec(i, "alice" if i % 2 else "bob") for i in range(6)))
            now = time.perf_counter_ns()
            fed.active["live"] = ActiveRequest("live", "carol", "m", "openai",
                                               "/v1/chat/completions", True, fed.now,
                                               now - 2 * 10**9)
            return Server(url, ctx, fed.bus)

        yield start


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        body = await r.text()
        ctype = r.headers.get("Content-Type", "")
        data = json.loads(body) if ctype.startswith("application/json") else body
        return r.status, data, r.headers


async def post(url: str, payload: Any, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        data = raw if raw is not None else json.dumps(payload).encode()
        async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json()


async def test_snapshot_windows_and_extras(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, snap, _ = await get(srv.url + "/llmtop/v1/snapshot")
    assert status == 200 and snap["window_s"] == 60
    assert snap["system"]["requests"] == 6 and snap["system"]["in_flight"] == 1
    assert snap["llmtop_version"] == "test" and snap["upstream"] == "http://up:1"
    assert snap["recording"] is None
    for w, want in (("10", 10), ("300", 300), ("all", None)):
        status, snap, _ = await get(srv.url + f"/llmtop/v1/snapshot?window={w}")
        assert status == 200 and snap["window_s"] == want
    assert "bins" not in snap["capacity"]  # only merges need them: a thousand after a soak
    assert "max_concurrency_at_slo" in snap["capacity"]
    status, snap, _ = await get(srv.url + "/llmtop/v1/snapshot?window=all&user_histograms=1")
    assert all("histograms" in u for u in snap["users"] if u["requests"])
    assert snap["capacity"]["bins"] and snap["capacity"]["bins"][0]["requests"] >= 1


@pytest.mark.parametrize("bad", ["30", "abc", "-1", "60s"])
async def test_bad_window_is_a_400_json_error(make_server: Callable[..., Any], bad: str) -> None:
    srv = await make_server()
    status, body, _ = await get(srv.url + f"/llmtop/v1/snapshot?window={bad}")
    assert status == 400 and "window" in body["error"]


async def test_requests_active_and_recent(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, active, _ = await get(srv.url + "/llmtop/v1/requests?state=active")
    assert status == 200 and [a["id"] for a in active] == ["live"]
    assert active[0]["state"] == "waiting" and active[0]["age_s"] >= 2
    # the recording's request shape, fields so far (QA: status, outcome, e2e_s,
    # prompt_tokens, token_source and error were missing)
    _, recent_one, _ = await get(srv.url + "/llmtop/v1/requests?state=recent&limit=1")
    missing = set(recent_one[0]) - {"chunk_offsets_s", "chunk_tokens"} - set(active[0])
    assert not missing, missing
    assert active[0]["outcome"] is None and active[0]["e2e_s"] is None
    status, recent, _ = await get(srv.url + "/llmtop/v1/requests?state=recent&limit=4")
    assert status == 200 and [r["id"] for r in recent] == ["r2", "r3", "r4", "r5"]
    status, default, _ = await get(srv.url + "/llmtop/v1/requests")
    assert status == 200 and [a["id"] for a in default] == ["live"]
    for q in ("state=old", "state=recent&limit=x", "state=recent&limit=-1"):
        status, body, _ = await get(srv.url + "/llmtop/v1/requests?" + q)
        assert status == 400 and body["error"]


async def test_metrics_is_prometheus_text(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, text, headers = await get(srv.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    ok = [s for s in fams["llmtop_requests"].samples if s.labels.get("outcome") == "ok"]
    assert ok[0].value == 6
    assert fams["llmtop_in_flight"].samples[0].value == 1


async def test_recording_control(make_server: Callable[..., Any], tmp_path: Path) -> None:
    srv = await make_server()
    url = srv.url + "/llmtop/v1/recording"
    assert (await post(url, None, raw=b"{not json"))[0] == 400
    assert (await post(url, ["start"]))[0] == 400
    assert (await post(url, {"action": "pause"}))[0] == 400
    assert (await post(url, {"action": "start"}))[0] == 400
    assert (await post(url, {"action": "stop"}))[0] == 409
    status, body = await post(url, {"action": "start", "path": str(tmp_path / "no/dir/x.jsonl")})
    assert status in (400, 404) and "director" in body["error"]
    path = tmp_path / "session.jsonl"
    status, body = await post(url, {"action": "start", "path": str(path)})
    assert status == 200, body
    status, snap, _ = await get(srv.url + "/llmtop/v1/snapshot")
    assert snap["recording"] is not None and str(path) in json.dumps(snap["recording"])
    status, body = await post(url, {"action": "start", "path": str(tmp_path / "other.jsonl")})
    assert status == 409 and "already" in body["error"]
    srv.bus.publish(rec(99, "dave"))
    srv.bus.drain()
    status, body = await post(url, {"action": "stop"})
    assert status == 200
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and any(x.get("id") == "r99" for x in lines)
    status, state, _ = await get(url)
    assert status == 200 and state == {"available": True, "recording": None}


async def test_no_recorder_is_a_501(make_server: Callable[..., Any]) -> None:
    srv = await make_server(recorder=False)
    status, body = await post(srv.url + "/llmtop/v1/recording",
                              {"action": "start", "path": "/tmp/x.jsonl"})
    assert status == 501 and "not available" in body["error"]


async def test_health(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, body, _ = await get(srv.url + "/llmtop/v1/health")
    assert status == 200 and body["status"] == "ok"
    assert body["requests"] == 6 and body["in_flight"] == 1 and body["recording"] is False
    assert body["recording_error"] is None


ROUTES = ["/llmtop/v1/snapshot", "/llmtop/v1/requests", "/metrics", "/llmtop/v1/health",
          "/llmtop/v1/recording", "/nope"]


@pytest.mark.parametrize("path", ROUTES)
async def test_token_is_required_on_every_route(make_server: Callable[..., Any],
                                                path: str) -> None:
    srv = await make_server(token="s3cret-token")
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                    {"Authorization": "Basic s3cret-token"}):
        status, body, hdrs = await get(srv.url + path, headers)
        assert status == 401, headers
        assert "token" in body["error"] and hdrs["WWW-Authenticate"].startswith("Bearer")
    status, body, _ = await get(srv.url + path, {"Authorization": "Bearer s3cret-token"})
    assert status == (404 if path == "/nope" else 200)
    if path == "/nope":
        assert body["error"]


async def test_unknown_routes_and_methods_answer_json(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, body, _ = await get(srv.url + "/llmtop/v1/nothing")
    assert status == 404 and body["error"]
    async with aiohttp.ClientSession() as s, s.delete(srv.url + "/llmtop/v1/snapshot") as r:
        assert r.status == 405 and (await r.json())["error"]


async def test_self_authenticated_paths_skip_the_admin_token() -> None:
    """A route that checks its own secret (the workers' ingest) is reachable without the
    admin token; every other route still asks for it."""

    async def ingest(request: web.Request) -> web.Response:
        ok = request.headers.get("X-Own-Secret") == "w0rker"
        return web.json_response({"ok": ok}, status=200 if ok else 403)

    ctx = AdminContext(aggregator=Aggregator(Config()), active={}, admin_token="adm1n",
                       self_authenticated=frozenset({"/llmtop/v1/_ingest"}))
    app = make_admin_app(ctx)
    app.router.add_post("/llmtop/v1/_ingest", ingest)
    async with admin_servers() as servers, aiohttp.ClientSession() as s:
        url = await servers.serve(app)
        async with s.post(url + "/llmtop/v1/_ingest", headers={"X-Own-Secret": "w0rker"}) as r:
            assert r.status == 200
        async with s.post(url + "/llmtop/v1/_ingest") as r:
            assert r.status == 403  # its own check, not the admin guard
        async with s.get(url + "/llmtop/v1/health") as r:
            assert r.status == 401


async def test_max_age_shares_one_snapshot_between_fast_pollers(
        make_server: Callable[..., Any]) -> None:
    from llmtop.tui.source import AdminSource

    srv = await make_server()
    snap_url = srv.url + "/llmtop/v1/snapshot"
    for bad in ("abc", "-1", "11", "nan"):
        status, body, _ = await get(f"{snap_url}?max_age={bad}")
        assert status == 400 and "max_age" in body["error"], bad
    _, first, _ = await get(snap_url + "?max_age=5")
    srv.bus.publish(rec(50, "dave"))
    srv.bus.drain()
    _, shared, _ = await get(snap_url + "?max_age=5")
    assert shared == first and shared["system"]["requests"] == 6  # built once, served twice
    _, fresh, _ = await get(snap_url)  # no max_age: always a fresh one
    assert fresh["system"]["requests"] == 7
    _, other_window, _ = await get(snap_url + "?window=10&max_age=5")
    assert other_window["window_s"] == 10  # one shared snapshot per query
    source = AdminSource([srv.url], max_age_s=5)  # what the TUI commands send
    try:
        via_tui = await source.fetch(60)
    finally:
        await source.close()
    assert via_tui["system"]["requests"] == 7 and via_tui["time"] == fresh["time"]


async def test_max_age_shares_the_request_lists_between_fast_pollers(
        make_server: Callable[..., Any]) -> None:
    from llmtop.tui.source import AdminSource

    srv = await make_server()
    url = srv.url + "/llmtop/v1/requests"
    for bad in ("abc", "-1", "11", "nan"):
        status, body, _ = await get(f"{url}?state=active&max_age={bad}")
        assert status == 400 and "max_age" in body["error"], bad
    _, first, _ = await get(url + "?state=active&max_age=5")
    assert [r["id"] for r in first] == ["live"]
    srv.ctx.active["next"] = ActiveRequest("next", "dave", "m", "openai",
                                           "/v1/chat/completions", True, T0,
                                           time.perf_counter_ns())
    _, shared, _ = await get(url + "?state=active&max_age=5")
    assert shared == first  # built once, served twice (ages and all)
    _, fresh, _ = await get(url + "?state=active")  # no max_age: always a fresh list
    assert [r["id"] for r in fresh] == ["live", "next"]
    assert fresh[0]["age_s"] > first[0]["age_s"]
    _, default_state, _ = await get(url + "?max_age=5")  # active is the default state
    assert [r["id"] for r in default_state] == ["live", "next"]
    _, recent2, _ = await get(url + "?state=recent&limit=2&max_age=5")
    srv.bus.publish(rec(60, "erin"))
    srv.bus.drain()
    _, recent3, _ = await get(url + "?state=recent&limit=3&max_age=5")  # its own list
    assert [r["id"] for r in recent2] == ["r4", "r5"]
    assert [r["id"] for r in recent3] == ["r4", "r5", "r60"]
    _, recent2_again, _ = await get(url + "?state=recent&limit=2&max_age=5")
    assert recent2_again == recent2
    source = AdminSource([srv.url], max_age_s=5)  # what the TUI commands send
    try:
        via_tui = await source.active_requests()
    finally:
        await source.close()
    assert [r["id"] for r in via_tui] == ["live", "next"] and via_tui == default_state


async def test_histograms_0_leaves_the_encoded_histograms_out(
        make_server: Callable[..., Any]) -> None:
    from llmtop.tui.source import AdminSource

    srv = await make_server()
    snap_url = srv.url + "/llmtop/v1/snapshot"
    _, full, _ = await get(snap_url + "?max_age=5")
    _, lean, _ = await get(snap_url + "?max_age=5&histograms=0")
    assert set(full["histograms"]) == {"ttft", "itl", "chunk_gap", "tpot", "e2e"}
    assert "histograms" not in lean  # not the shared full one: cached apart
    full.pop("histograms")
    assert {k: v for k, v in lean.items() if k != "time"} == \
        {k: v for k, v in full.items() if k != "time"}
    _, again, _ = await get(snap_url + "?max_age=5")
    assert "histograms" in again
    source = AdminSource([srv.url], max_age_s=5)  # one proxy: the TUI does not ask them
    try:
        via_tui = await source.fetch(60)
    finally:
        await source.close()
    assert "histograms" not in via_tui and via_tui["system"]["requests"] == 6


async def test_a_screen_tick_is_one_request_with_active_1(
        make_server: Callable[..., Any]) -> None:
    """``?active=1`` puts the active list (as ``/requests?state=active`` answers it) in the
    snapshot, so the TUI's tick costs the proxy one request, not two; an older proxy that
    leaves it out still gets the list asked for on its own."""
    from llmtop.tui.source import REQUESTS_PATH, SNAPSHOT_PATH, AdminSource

    srv = await make_server()
    _, plain, _ = await get(srv.url + "/llmtop/v1/snapshot?max_age=5")
    _, with_active, _ = await get(srv.url + "/llmtop/v1/snapshot?max_age=5&active=1")
    _, listed, _ = await get(srv.url + "/llmtop/v1/requests?state=active")
    assert "active_requests" not in plain  # a cached snapshot of its own per flag
    assert [r["id"] for r in with_active["active_requests"]] == [r["id"] for r in listed]
    assert with_active["active_requests"][0].keys() == listed[0].keys()

    for max_age_s, gets in ((0.0, 3), (5.0, 1)):
        source = AdminSource([srv.url], max_age_s=max_age_s)
        paths: list[str] = []
        real_get = source._get_aged

        async def counting_get(url: str, path: str, params: dict[str, str],
                               real: Any = real_get, seen: list[str] = paths) -> Any:
            seen.append(path)
            return await real(url, path, params)

        source._get_aged = counting_get  # type: ignore[method-assign]
        try:
            for _ in range(3):  # three ticks of the screen
                await source.fetch(60)
                rows = await source.active_requests()
                assert [r["id"] for r in rows] == ["live"]
            # one request a tick; none while the last answer is young enough (max_age)
            assert paths == [SNAPSHOT_PATH] * gets and source.gets == gets
            # without a snapshot just fetched, the list is asked for on its own
            assert [r["id"] for r in await source.active_requests()] == ["live"]
            assert paths[-1] == REQUESTS_PATH and source.gets == gets + 1
        finally:
            await source.close()


async def test_answers_say_their_age_and_the_tui_keeps_them_until_max_age(
        make_server: Callable[..., Any]) -> None:
    """``X-Llmtop-Age``: 0 on a fresh answer, the seconds since it was built on a shared
    one. ``AdminSource`` keeps a snapshot until it is ``max_age_s`` old counting that age,
    so a screen never shows data older than it asked for."""
    from llmtop.admin import AGE_HEADER
    from llmtop.tui.source import AdminSource

    srv = await make_server()
    for path in ("/llmtop/v1/snapshot?window=60&active=1", "/llmtop/v1/requests?state=active"):
        _, _, fresh = await get(srv.url + path)  # built now, and kept for max_age askers
        assert fresh[AGE_HEADER] == "0", path
        await asyncio.sleep(0.05)
        _, _, shared = await get(srv.url + path + "&max_age=5")
        assert 0.05 <= float(shared[AGE_HEADER]) < 5, path

    # (3 s: a pause of the machine under the 2.4 s left between the shared answer and the
    # next fetch; 1 s left 0.4 s, which a loaded machine can take)
    first = AdminSource([srv.url], max_age_s=3.0)
    late = AdminSource([srv.url], max_age_s=3.0)
    try:
        await first.fetch(60)  # the proxy builds one (age 0)
        await asyncio.sleep(0.6)
        snap = await late.fetch(60)  # shared: 0.6 s old already, so young for 2.4 s more
        assert late.gets == 1 and snap["system"]["requests"] == 6
        assert await late.fetch(60) is snap and late.gets == 1  # kept: no request
        assert [r["id"] for r in await late.active_requests()] == ["live"]
        srv.bus.publish(rec(70, "dave"))
        srv.bus.drain()
        await asyncio.sleep(2.6)  # 3.2 s old: were the age ignored it would still be kept (2.6 s)
        again = await late.fetch(60)
        assert late.gets == 2 and again["system"]["requests"] == 7
    finally:
        await first.close()
        await late.close()


async def test_a_proxy_that_does_not_say_the_age_is_asked_every_tick() -> None:
    """An older proxy sends no ``X-Llmtop-Age``: its answer may already be ``max_age``
    old, so the TUI keeps nothing and asks each tick, as it did before."""
    from llmtop.tui.source import AdminSource

    served = 0

    async def old_snapshot(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        return web.json_response({"version": 1, "window_s": 60, "n": served})

    app = web.Application()
    app.router.add_get("/llmtop/v1/snapshot", old_snapshot)
    async with admin_servers() as servers:
        source = AdminSource([await servers.serve(app)], max_age_s=5.0)
        try:
            got = [(await source.fetch(60))["n"] for _ in range(3)]
        finally:
            await source.close()
    assert got == [1, 2, 3] and source.gets == 3


async def test_snapshot_json_is_valid_whatever_the_numbers(
        make_server: Callable[..., Any]) -> None:
    """Non-finite floats become null (JSON has no NaN); an int past 64 bits, which orjson
    refuses, still comes out right through the standard encoder."""
    import numpy as np

    srv = await make_server()
    srv.ctx.extra_info.update({"nan": float("nan"), "inf": np.float64("inf"),
                               "np_int": np.int64(7), "ok": 1.5})
    status, snap, headers = await get(srv.url + "/llmtop/v1/snapshot")
    assert status == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
    assert (snap["nan"], snap["inf"], snap["np_int"], snap["ok"]) == (None, None, 7, 1.5)
    srv.ctx.extra_info.pop("np_int")
    srv.ctx.extra_info["big"] = 2**70
    status, snap, _ = await get(srv.url + "/llmtop/v1/snapshot")
    assert status == 200 and snap["big"] == 2**70 and snap["nan"] is None
