"""QA of ``llmtop attach URL1 URL2 ...`` over real proxies (``llmtop run --headless`` in
front of the built-in simulator), read the way attach reads them (``AdminSource`` with the
merge function ``llmtop attach`` passes it)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web
from test_workers import chat, start_run

from llmtop.cli.attach import fleet_merge
from llmtop.sim.server import running_sim
from llmtop.tui.source import AdminSource

FETCH_TIMEOUT_S = 10.0
"""The sources' timeout (the TUI's is 2 s): each test reads some figures from one fetch
(after :func:`settled`, or right after a proxy is killed), and a loaded CI machine may take
the proxy processes past 2 s to answer; nothing here waits for a timeout (a proxy killed
is refused at once, the malformed one answers at once)."""


def source_of(urls: list[str], **kw: Any) -> AdminSource:
    """The admin URLs read as `llmtop attach` reads them, with :data:`FETCH_TIMEOUT_S`."""
    return AdminSource(urls, timeout_s=FETCH_TIMEOUT_S, **kw)


@asynccontextmanager
async def proxies(*extra: tuple[str, ...]) -> AsyncIterator[list[tuple[str, str]]]:
    """One headless proxy per ``extra`` (its extra flags), all in front of one simulator:
    their (proxy, admin) URLs."""
    async with running_sim("tiny", max_num_seqs=16) as sim:
        procs: list[asyncio.subprocess.Process] = []
        urls: list[tuple[str, str]] = []
        try:
            for flags in extra:
                proc, proxy, admin = await start_run(
                    "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                    "--gpu-source", "none", *flags)
                procs.append(proc)
                urls.append((proxy, admin))
            yield urls
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                await asyncio.wait_for(p.communicate(), 60)


async def traffic(proxy: str, n: int) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            assert await chat(s, proxy)


async def settled(source: AdminSource, requests: int) -> dict[str, Any]:
    """The merged whole-session snapshot once it counts ``requests`` (or after 10 s)."""
    snap: dict[str, Any] = {}
    for _ in range(100):
        snap = await source.fetch(None)
        if snap["system"]["requests"] >= requests:
            break
        await asyncio.sleep(0.1)
    return snap


@asynccontextmanager
async def fake_admin(snapshot: dict[str, Any]) -> AsyncIterator[str]:
    """An admin API that answers every snapshot request with ``snapshot``."""

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({**snapshot, "window_s": None
                                  if request.query.get("window") == "all" else 60})

    app = web.Application()
    app.router.add_get("/llmtop/v1/snapshot", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_proxy_answering_a_malformed_snapshot_is_left_out_not_the_view() -> None:
    """QA: a third "proxy" whose snapshot has the right window but a malformed section
    (``capacity.bins`` rows without ``concurrency``, or ``system`` a list) made the merge
    raise KeyError/TypeError, which attach does not expect: the whole screen went to
    "disconnected: KeyError: 'concurrency'" although two proxies answered. Now the merge
    refuses it with a ValueError, so attach leaves that one out, named with the reason,
    and shows the other two merged."""
    async with proxies((), ()) as urls:
        await traffic(urls[0][0], 3)
        await traffic(urls[1][0], 2)
        for bad in ({"version": 1, "system": {}, "capacity": {"bins": [{"requests": 3}]}},
                    {"version": 1, "system": [1, 2]},
                    {"version": 1, "system": {}, "gpus": 7}):
            async with fake_admin(bad) as odd:
                source = source_of([urls[0][1], urls[1][1], odd])
                try:
                    snap = await settled(source, 5)
                    assert snap["system"]["requests"] == 5
                    assert snap["sources"] == 2
                    assert source.errors[odd] is not None
                    assert "malformed" in source.errors[odd], source.errors[odd]
                    assert source.describe().startswith("2/3 proxies up · down: " + odd)
                finally:
                    await source.close()


async def test_one_proxy_reached_by_two_addresses_is_counted_once() -> None:
    """QA: ``llmtop attach A localhost:PORT_OF_A B`` (one proxy by two names: localhost and
    127.0.0.1, a host name and its IP) merged A's snapshot twice: every count, rate and
    histogram of A doubled, silently (5 + 3 requests read 13). Now each running proxy
    (host, start instant, upstream) counts once and a DUPLICATE_PROXY warning says so."""
    async with proxies((), ()) as urls:
        (proxy_a, admin_a), (proxy_b, admin_b) = urls
        await traffic(proxy_a, 5)
        await traffic(proxy_b, 3)
        alias = admin_a.replace("127.0.0.1", "localhost")
        source = source_of([admin_a, alias, admin_b], merge=fleet_merge())
        try:
            snap = await settled(source, 8)
            await asyncio.sleep(0.5)
            snap = await source.fetch(None)
        finally:
            await source.close()
        assert snap["system"]["requests"] == 8
        assert snap["latency"]["ttft"]["count"] == 8
        assert snap["sources"] == 2
        (dup,) = [w for w in snap["warnings"] if w["code"] == "DUPLICATE_PROXY"]
        assert "more than once" in dup["message"] and "(2 addresses)" in dup["message"]
        source = source_of([admin_a, admin_b], merge=fleet_merge())  # no alias: no warning
        try:
            snap = await source.fetch(None)
        finally:
            await source.close()
        assert snap["system"]["requests"] == 8
        assert not [w for w in snap["warnings"] if w["code"] == "DUPLICATE_PROXY"]


async def test_the_same_admin_url_twice_is_a_usage_error() -> None:
    """The same address twice (``HOST:PORT`` and ``http://HOST:PORT/``) is a typo that
    would double every figure: a one-line error and exit code 2, before any screen."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "attach", "127.0.0.1:9", "http://127.0.0.1:9/",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, (out, err)
    assert err.decode().strip().splitlines()[-1] == (
        "llmtop attach: error: ADMIN_URL http://127.0.0.1:9 is given more than once")


async def test_proxies_with_different_slos_say_so() -> None:
    """QA: ``llmtop attach A B`` where B runs with ``--slo-ttft 0.001`` (a fleet whose
    proxies were not given one config) showed SLO attainment 0.625 under A's SLO (TTFT
    0.5 s) with nothing to say that B's 3 requests had been judged by another one. Now a
    MIXED_SLO warning names each proxy's SLOs."""
    async with proxies((), ("--slo-ttft", "0.001")) as urls:
        (proxy_a, admin_a), (proxy_b, admin_b) = urls
        await traffic(proxy_a, 5)
        await traffic(proxy_b, 3)
        source = source_of([admin_a, admin_b], merge=fleet_merge())
        try:
            snap = await settled(source, 8)
        finally:
            await source.close()
        assert snap["system"]["requests"] == 8
        (mixed,) = [w for w in snap["warnings"] if w["code"] == "MIXED_SLO"]
        assert "itl_p95=0.05,target=0.95,ttft=0.5 on 1 proxy" in mixed["message"]
        assert "itl_p95=0.05,target=0.95,ttft=0.001 on 1 proxy" in mixed["message"]
    async with proxies((), ()) as urls:  # the same SLOs: no warning
        await traffic(urls[0][0], 1)
        source = source_of([urls[0][1], urls[1][1]], merge=fleet_merge())
        try:
            snap = await settled(source, 1)
        finally:
            await source.close()
        assert not [w for w in snap["warnings"] if w["code"] == "MIXED_SLO"]



async def test_a_proxy_killed_and_restarted_says_so_and_never_counts_negative() -> None:
    """QA: one of two proxies (the other with ``--workers 2``) killed with SIGKILL and
    started again on the same addresses: while down it is named with the reason and the
    merged figures are the other's (none negative), and a PROXY_DOWN warning says why;
    once back, its counters start from zero, so the fleet's whole-session figures went
    back by all it had counted — and the header read "2 proxies" as before, without a
    word. Now a PROXY_RESTARTED warning names it."""
    async with running_sim("tiny", max_num_seqs=16) as sim:
        flags = ("--upstream", sim.url, "--gpu-source", "none")
        a, proxy_a, admin_a = await start_run(*flags, "--listen", "127.0.0.1:0",
                                              "--admin", "127.0.0.1:0")
        b, proxy_b, admin_b = await start_run(*flags, "--listen", "127.0.0.1:0",
                                              "--admin", "127.0.0.1:0", "--workers", "2")
        source = source_of([admin_a, admin_b], merge=fleet_merge())
        try:
            await traffic(proxy_a, 5)
            await traffic(proxy_b, 3)
            snap = await settled(source, 8)
            assert snap["system"]["requests"] == 8
            assert not [w for w in snap["warnings"] if w["code"] == "PROXY_RESTARTED"]
            first_start = snap["started_at"]
            a.kill()
            await a.wait()
            snap = await source.fetch(None)
            assert snap["system"]["requests"] == 3  # b's alone: not 8, nor below 3
            assert source.describe() == f"1/2 proxies up · down: {admin_a}"
            assert [w["message"] for w in snap["warnings"] if w["code"] == "PROXY_DOWN"] == [
                f"the proxy at {admin_a} is left out: connection refused (next try in 1 s)"]
            a, _, _ = await start_run(*flags, "--listen", proxy_a.removeprefix("http://"),
                                      "--admin", admin_a.removeprefix("http://"))
            await traffic(proxy_a, 1)
            snap = await settled(source, 4)
            assert (snap["system"]["requests"], snap["sources"]) == (4, 2)
            assert source.describe() == "2 proxies"
            assert not [w for w in snap["warnings"] if w["code"] == "PROXY_DOWN"]
            (note,) = [w for w in snap["warnings"] if w["code"] == "PROXY_RESTARTED"]
            assert f"the proxy at {admin_a} restarted" in note["message"]
            assert note["since"] > first_start  # when the new one started
            snap = await source.fetch(60)  # within the window too; b is named for nothing
            assert [w["message"] for w in snap["warnings"]
                    if w["code"] == "PROXY_RESTARTED"] == [note["message"]]
        finally:
            await source.close()
            for p in (a, b):
                if p.returncode is None:
                    p.send_signal(signal.SIGTERM)
                await asyncio.wait_for(p.communicate(), 60)
