"""QA of ``llmtop attach`` pointed at what an operator may give it by mistake, over real
sockets: each must be named with a reason that says what is wrong, and never merged.

- A proxy whose snapshot is another ``version`` (a newer llmtop: some field means something
  else) was merged as version 1's and the merged figures silently counted it.
- The proxy's forwarding port (``--listen``) instead of its ``--admin`` one hands the
  snapshot path to the engine, whose 404 was shown as "HTTP 404 {"error": {"message": …"; a
  web server's HTML page as "HTTP 404 <!DOCTYPE html>".
- With several proxies the screen said only "down: URL", whatever the reason (a refused
  token, a dead host, one of the above): now a PROXY_DOWN warning for each gives it, and
  when it is tried again (after a backoff: ``llmtop.tui.retries``)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from net_support import serving
from tui_support import RealAdmin

from llmtop.bus import EventBus
from llmtop.cli.attach import fleet_merge
from llmtop.config import load_config
from llmtop.metrics.snapshot import VERSION
from llmtop.proxy.server import ProxyServer
from llmtop.sim.server import running_sim
from llmtop.tui.source import SNAPSHOT_PATH, SNAPSHOT_VERSION, AdminSource, SourceUnavailable


def down_notes(snap: dict[str, Any]) -> list[str]:
    return [w["message"] for w in snap["warnings"] if w["code"] == "PROXY_DOWN"]


def down_reasons(snap: dict[str, Any]) -> list[str]:
    """:func:`down_notes` without when each is tried next (it depends on the clock)."""
    return [re.sub(r" \((next try in \d+ s|trying again now)\)$", "", note)
            for note in down_notes(snap)]


FIRST_TRY = " (next try in 1 s)"
"""What a PROXY_DOWN warning ends with in the fetch where the proxy first failed."""


def test_attach_reads_the_version_the_proxy_writes() -> None:
    assert SNAPSHOT_VERSION == VERSION


async def real_snapshot(admin: RealAdmin) -> dict[str, Any]:
    """What the real admin API answers attach (whole session, histograms per user)."""
    async with aiohttp.ClientSession() as s, s.get(
            admin.url + SNAPSHOT_PATH, params={"window": "all", "user_histograms": "1"}) as r:
        snap: dict[str, Any] = await r.json()
    return snap


@asynccontextmanager
async def answering(snapshot: dict[str, Any]) -> AsyncIterator[str]:
    """An admin API on 127.0.0.1 that answers ``snapshot``, whatever is asked."""
    async def snap(request: web.Request) -> web.Response:
        return web.json_response(snapshot)

    async with serving(web.get(SNAPSHOT_PATH, snap)) as url:
        yield url


@pytest.mark.parametrize(("version", "why"), [
    (2, "its snapshot is version 2, newer than this llmtop reads (1): attach with that "
        "proxy's llmtop version"),
    ("1.0", 'its snapshot version "1.0" is not one this llmtop reads (1)'),
    (True, "its snapshot version true is not one this llmtop reads (1)"),
])
async def test_a_proxy_of_another_snapshot_version_is_named_not_merged(
        admin: RealAdmin, version: object, why: str) -> None:
    for i in range(3):
        admin.request(i, "alice")
    # another proxy's snapshot, as real as this one's, but of another version
    other = {**await real_snapshot(admin), "version": version, "host": "gpu-node-2"}
    async with answering(other) as odd:
        merged, described, info = await with_and_alone(admin, odd)
    assert merged["system"]["requests"] == 3  # this proxy's only: the odd one not added in
    assert [u["requests"] for u in merged["users"]] == [3]
    assert described == f"1/2 proxies up · down: {odd}"
    assert down_notes(merged) == [f"the proxy at {odd} is left out: {why}{FIRST_TRY}"]
    assert info == f"{odd}: {why}"


async def with_and_alone(admin: RealAdmin, url: str) -> tuple[dict[str, Any], str, str]:
    """The merged snapshot of ``admin`` attached with ``url``, that attach's header label,
    and what attaching to ``url`` alone raises (:class:`SourceUnavailable`'s text)."""
    fleet = AdminSource([admin.url, url], merge=fleet_merge())
    alone = AdminSource([url])
    try:
        merged = await fleet.fetch(None)
        with pytest.raises(SourceUnavailable) as info:
            await alone.fetch(None)
    finally:
        await fleet.close()
        await alone.close()
    return merged, fleet.describe(), str(info.value)


@asynccontextmanager
async def proxy_port() -> AsyncIterator[str]:
    """A real proxy's forwarding port, in front of the simulator."""
    async with running_sim("tiny") as sim:
        cfg = load_config(env={}, overrides={"upstream": sim.url, "listen": "127.0.0.1:0"})
        proxy = ProxyServer(cfg, EventBus())
        url = await proxy.start()
        try:
            yield url
        finally:
            await proxy.shutdown(1.0)


@asynccontextmanager
async def web_page(status: int) -> AsyncIterator[str]:
    """A web server answering every path with an HTML page."""
    async def page(request: web.Request) -> web.Response:
        return web.Response(status=status, text="<!DOCTYPE html>\n<html><body>It works"
                            "</body></html>", content_type="text/html")

    async with serving(web.get("/{path:.*}", page)) as url:
        yield url


NOT_ADMIN = ("HTTP 404: not an llmtop admin API — a proxy's --listen port instead of its "
             "--admin one?")


@pytest.mark.parametrize(("target", "why"), [
    (proxy_port, NOT_ADMIN),
    (lambda: web_page(404), NOT_ADMIN),
    (lambda: web_page(200), "reply is not JSON: not an llmtop admin API"),
], ids=["the proxy's own port", "a 404 page", "a 200 page"])
async def test_an_address_that_is_no_admin_api_says_so(admin: RealAdmin, target: Any,
                                                       why: str) -> None:
    admin.request(1, "alice")
    async with target() as url:
        merged, described, info = await with_and_alone(admin, url)
    assert merged["system"]["requests"] == 1
    assert info == f"{url}: {why}"
    assert described == f"1/2 proxies up · down: {url}"
    assert down_notes(merged) == [f"the proxy at {url} is left out: {why}{FIRST_TRY}"]


async def test_every_down_proxy_is_named_with_its_reason(admin: RealAdmin) -> None:
    """A refused token beside a page that is no admin API: each with its own reason, in
    a warning while the others show and, when none answers, in the one-line error; the
    warnings go once the proxies answer."""
    admin.request(1, "alice")
    guarded = RealAdmin()
    guarded.ctx.admin_token = "tok"
    await guarded.start()
    try:
        async with web_page(404) as page:
            fleet = AdminSource([admin.url, guarded.url, page], merge=fleet_merge())
            none = AdminSource([guarded.url, page], merge=fleet_merge())
            try:
                merged = await fleet.fetch(None)
                with pytest.raises(SourceUnavailable) as info:
                    await none.fetch(None)
                guarded.ctx.admin_token = ""
                healed = await fleet.fetch(None)
                for _ in range(200):  # asked again once its backoff (1 s) is over
                    if len(down_notes(healed)) == 1:
                        break
                    await asyncio.sleep(0.05)
                    healed = await fleet.fetch(None)
            finally:
                await fleet.close()
                await none.close()
    finally:
        await guarded.stop()
    refused = "HTTP 401: the admin token was refused"
    assert down_notes(merged) == [
        f"the proxy at {guarded.url} is left out: {refused}{FIRST_TRY}",
        f"the proxy at {page} is left out: {NOT_ADMIN}{FIRST_TRY}"]
    assert down_reasons(healed) == [f"the proxy at {page} is left out: {NOT_ADMIN}"]
    assert fleet.describe() == f"2/3 proxies up · down: {page}"
    assert str(info.value) == (f"none of 2 proxies answers: {guarded.url}: {refused}; "
                               f"{page}: {NOT_ADMIN}")
    assert "\n" not in str(info.value) and json.dumps(str(info.value))
