"""QA of ``llmtop attach URL1 URL2 ...`` over real proxies (``llmtop run --headless`` in
front of the built-in simulator), read the way attach reads them (``AdminSource`` with the
merge function ``llmtop attach`` passes it)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web
from test_workers import chat, start_run

from llmtop.sim.server import running_sim
from llmtop.tui.source import AdminSource


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
                source = AdminSource([urls[0][1], urls[1][1], odd])
                try:
                    snap = await settled(source, 5)
                    assert snap["system"]["requests"] == 5
                    assert snap["sources"] == 2
                    assert source.errors[odd] is not None
                    assert "malformed" in source.errors[odd], source.errors[odd]
                    assert source.describe().startswith("2/3 proxies up · down: " + odd)
                finally:
                    await source.close()
