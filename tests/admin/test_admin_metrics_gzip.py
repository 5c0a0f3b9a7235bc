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
from admin_support import admin_servers
from prometheus_client.parser import text_string_to_metric_families

from llmtop.admin.routes import accepts_gzip


@pytest.fixture
async def admin_port() -> AsyncIterator[int]:
    async with admin_servers() as servers:
        url = await servers.serve_admin([f"user-{i}" for i in range(12)])
        yield int(url.rpartition(":")[2])


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
