"""/metrics was never compressed, though Prometheus asks for gzip on every scrape
(``Accept-Encoding: gzip``) and the text of a busy proxy is large. It is now gzip when the
scraper takes it (RFC 9110's q-values honoured), plain otherwise, with ``Vary``. Over a
real admin server on 127.0.0.1 port 0, read with http.client (which decodes nothing)."""

from __future__ import annotations

import asyncio
import gzip
import http.client
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmtop.admin.routes import AdminContext, accepts_gzip, make_admin_app
from llmtop.bus import EventBus
from llmtop.config import Config
from llmtop.events import ActiveRequest, RequestRecord
from llmtop.metrics.aggregator import Aggregator

T0 = 1_796_000_000.0


def record(i: int, user: str) -> RequestRecord:
    offs = tuple(0.2 + 0.02 * k for k in range(5))
    return RequestRecord(f"r{i}", user, "m", "openai", "/v1/chat/completions", True, 200, "ok",
                         T0 + i, 0.2, offs[-1], 10, 5, "usage", offs, (1,) * 5, 1)


@pytest.fixture
async def admin_port() -> AsyncIterator[int]:
    clock = [T0]
    bus = EventBus()
    active: dict[str, ActiveRequest] = {}
    agg = Aggregator(Config(), active, clock=lambda: clock[0], upstream="http://up:1")
    bus.subscribe(agg.on_events)
    for i in range(12):
        clock[0] += 1.0
        bus.publish(record(i, f"user-{i}"))
        bus.drain()
    runner = web.AppRunner(make_admin_app(AdminContext(aggregator=agg, active=active)),
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def scrape(port: int, encoding: str | None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={} if encoding is None else {
            "Accept-Encoding": encoding})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("encoding", "zipped"), [
    (None, False), ("gzip", True), ("gzip, deflate, br", True), ("identity", False),
    ("gzip;q=0", False), ("*", True), ("*;q=0", False), ("deflate", False),
])
async def test_metrics_is_gzip_when_the_scraper_takes_it(admin_port: int, encoding: str | None,
                                                        zipped: bool) -> None:
    status, headers, body = await asyncio.to_thread(scrape, admin_port, encoding)
    assert status == 200
    assert "accept-encoding" in headers.get("vary", "").lower()
    assert (headers.get("content-encoding") == "gzip") is zipped
    text = (gzip.decompress(body) if zipped else body).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    users = {s.labels["user"] for s in fams["llmtop_user_ttft_seconds"].samples}
    assert users == {f"user-{i}" for i in range(12)}
    if zipped:
        assert len(body) < len(text) / 3


def test_accept_encoding_q_values() -> None:
    assert accepts_gzip("GZIP;Q=0.5")
    assert not accepts_gzip("gzip;q=nan") and not accepts_gzip("gzip;q=x")
    assert not accepts_gzip("*, gzip;q=0") and not accepts_gzip("gzip;q=0, *")
    assert accepts_gzip("x-gzip") and not accepts_gzip("")
