"""EngineScraper over real sockets: our own aiohttp server serving fixtures, then the
simulator's /metrics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmtop.config import Config
from llmtop.engines import (
    EngineScraper,
    engine_ttft_quantile,
    metrics_url_for,
    open_engine_scraper,
)
from llmtop.engines.scraper import INLINE_PARSE_CHARS, MAX_BYTES
from llmtop.events import EngineReading, Event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"


class Server:
    def __init__(self, body: str) -> None:
        self.body = body
        self.status = 200
        self.hits = 0
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.status != 200:
            return web.Response(status=self.status, text="404: Not Found")
        return web.Response(text=self.body, content_type="text/plain")


@contextlib.asynccontextmanager
async def serve(server: Server) -> AsyncIterator[Server]:
    app = web.Application()
    app.router.add_get("/metrics", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running(scraper: EngineScraper) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(scraper.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(cond: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``cond`` every 10 ms for up to ``limit_s`` seconds."""
    for _ in range(int(limit_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_metrics_url_for() -> None:
    assert metrics_url_for("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url_for("https://h.example:443") == "https://h.example:443/metrics"
    assert metrics_url_for("http://a:1", "http://b:2/prom") == "http://b:2/prom"
    assert metrics_url_for("") == ""


def test_open_engine_scraper() -> None:
    cfg = Config()
    s = open_engine_scraper(cfg, lambda e: None, upstream="http://127.0.0.1:8000/v1")
    assert s is not None and s.url == "http://127.0.0.1:8000/metrics"
    assert open_engine_scraper(cfg, lambda e: None, upstream="") is None
    cfg.engine.enabled = False
    assert open_engine_scraper(cfg, lambda e: None, upstream="http://x:1") is None


async def test_scrapes_fixture_over_socket_and_publishes() -> None:
    published: list[Event] = []
    srv = Server((FIXTURES / "vllm_v1_metrics.txt").read_text())
    async with serve(srv):
        sc = EngineScraper(srv.base + "/metrics", None, published.append, interval_s=0.02,
                           clock=lambda: 99.0)
        async with running(sc):
            await until(lambda: sc.scrapes >= 2)
    assert sc.status == f"vllm engine at {srv.base}/metrics"
    assert sc.latest is not None
    assert (sc.latest.t, sc.latest.kind, sc.latest.running) == (99.0, "vllm", 21.0)
    assert all(isinstance(e, EngineReading) for e in published) and len(published) >= 2


@pytest.mark.parametrize("pad", [0, INLINE_PARSE_CHARS])
async def test_small_exposition_parsed_on_the_loop_a_big_one_in_a_thread(
        pad: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read the same; only an exposition over INLINE_PARSE_CHARS goes to a thread
    (a small one costs less to parse than the hand-off to a thread and back)."""
    import llmtop.engines.scraper as scraper_mod

    threads: list[object] = []
    real = asyncio.to_thread

    async def counting_to_thread(fn: Callable[..., object], *a: object) -> object:
        threads.append(fn)
        return await real(fn, *a)

    monkeypatch.setattr(scraper_mod.asyncio, "to_thread", counting_to_thread)
    text = (FIXTURES / "vllm_v1_metrics.txt").read_text()
    srv = Server(text + "# padding\n" * (pad // 10 + 1) if pad else text)
    async with serve(srv):
        sc = EngineScraper(srv.base + "/metrics", None, lambda e: None, interval_s=0.02)
        async with aiohttp.ClientSession() as session:
            reading = await sc.scrape_once(session)
    assert (reading.kind, reading.running) == ("vllm", 21.0)
    assert len(threads) == (1 if pad else 0)


async def test_404_backs_off_then_recovers() -> None:
    """No /metrics: a clear status, growing delay between tries, no crash; then the
    engine appears and scraping starts."""
    srv = Server((FIXTURES / "tgi_metrics.txt").read_text())
    srv.status = 404
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None, interval_s=0.02,
                           max_backoff_s=0.2)
        loop = asyncio.get_running_loop()
        async with running(sc) as task:
            began = loop.time()
            # two tries at least, and half a second, however long the tries take (a loaded
            # machine's pause could leave a fixed half second only the first try)
            await until(lambda: srv.hits >= 2)
            await asyncio.sleep(max(0.0, 0.5 - (loop.time() - began)))
            took = loop.time() - began
            assert sc.status == f"no /metrics at {srv.base}/metrics (HTTP 404)"
            # constant 20 ms polling would be ~25 hits in 0.5 s (1 + 50 a second); doubling
            # up to 0.2 s is ≤ 7 (and 5 a second after): at most 3 + 10 a second
            assert 2 <= srv.hits <= 3 + 10 * took, (srv.hits, took)
            assert sc.latest is None and not task.done()
            srv.status = 200
            await until(lambda: sc.scrapes >= 1)
            assert sc.failures == 0 and sc.latest is not None and sc.latest.kind == "tgi"
        assert not session.closed


async def test_connection_refused() -> None:
    async with serve(Server("")) as srv:
        url = srv.base + "/metrics"
    sc = EngineScraper(url, None, lambda e: None, interval_s=0.01, max_backoff_s=0.02)
    async with running(sc) as task:
        await until(lambda: sc.failures >= 2)
        assert not task.done()
    assert sc.status.startswith(f"no /metrics at {url} (cannot connect")


async def test_html_instead_of_metrics() -> None:
    srv = Server("<html><body>hello</body></html>")
    async with serve(srv):
        sc = EngineScraper(srv.base + "/metrics", None, lambda e: None, interval_s=0.01)
        async with running(sc):
            await until(lambda: sc.failures >= 1)
    assert sc.status.startswith(f"{srv.base}/metrics is not Prometheus text (")


async def test_oversized_exposition_is_refused() -> None:
    srv = Server("a 1\n" * (MAX_BYTES // 4 + 10))
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None)
        with pytest.raises(Exception, match="larger than"):
            await sc.scrape_once(session)


async def test_against_llmtop_sim_metrics() -> None:
    """The simulator's /metrics (vLLM names + llmtop_sim_info) over a real socket, found
    from the upstream URL the way `llmtop run` would; its TTFT histogram counts the
    requests the simulator served."""
    from llmtop.sim.server import running_sim

    async with running_sim("tiny") as sim, aiohttp.ClientSession() as session:
        for _ in range(3):
            body = {"model": sim.profile.model, "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(sim.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
        url = metrics_url_for(sim.url + "/v1")
        sc = EngineScraper(url, session, lambda e: None, interval_s=0.02)
        async with running(sc):
            await until(lambda: sc.scrapes >= 1)
        served = len(sim.engine.records())
    r = sc.latest
    assert r is not None and r.kind == "sim"
    assert (r.running, r.waiting, r.preemptions) == (0.0, 0.0, 0.0)
    assert r.kv_cache_usage is not None and 0.0 <= r.kv_cache_usage <= 1.0
    assert r.ttft_buckets[-1] == (float("inf"), 3.0) and served == 3
    p50 = engine_ttft_quantile(r.ttft_buckets, 0.5)
    assert p50 is not None and p50 > 0
    assert sc.status == f"sim engine at {url}"


async def test_a_byte_order_mark_before_the_exposition_is_not_text() -> None:
    """Some Windows-built exporters begin with a UTF-8 BOM: read as text, it made the
    first line's name invalid and the scrape fail ("not Prometheus text")."""
    srv = Server("\ufeff" + (FIXTURES / "vllm_v1_metrics.txt").read_text())
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None, interval_s=1.0)
        reading = await sc.scrape_once(session)
    assert (reading.kind, reading.running) == ("vllm", 21.0)
