"""An upstream response whose ``Connection`` fields list ``close`` is the last on its
connection, whatever else they list (RFC 9112 9.3, 9.6): an HTTP/1.0 response with
``Connection: close`` and, in another field, ``keep-alive`` went back to the pool (the
later field undid the close), and the next request was sent on a connection the upstream
had said it would close. Raw upstream (it leaves the connection open, so reuse shows),
raw client."""

from __future__ import annotations

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import exchange, get, raw_upstream


@pytest.mark.parametrize("fields", [
    b"Connection: close\r\nConnection: keep-alive\r\n",
    b"Connection: keep-alive\r\nConnection: close\r\n",
    b"Connection: keep-alive, close\r\n",
    b"Connection: Keep-Alive\r\nConnection: CLOSE\r\n",
], ids=["close|keep-alive", "keep-alive|close", "keep-alive,close", "case"])
@pytest.mark.parametrize("version", [b"1.0", b"1.1"])
async def test_a_response_listing_close_is_not_pooled(version: bytes, fields: bytes) -> None:
    answer = (b"HTTP/" + version + b" 200 OK\r\nContent-Type: text/plain\r\n" + fields
              + b"Content-Length: 2\r\n\r\nok")

    async def respond(_head: bytes, _n: int) -> bytes:
        return answer

    async with raw_upstream(respond) as (url, heads, conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        got = await exchange(purl, [get("/a"), get("/b")])
    assert [(status, body) for status, _h, body in got] == [(200, b"ok"), (200, b"ok")]
    assert len(heads) == 2
    assert len(conns) == 2, "the second request went on the connection the first closed"


async def test_an_http10_keep_alive_response_is_still_pooled() -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n"
                b"Content-Length: 2\r\n\r\nok")

    async with raw_upstream(respond) as (url, _heads, conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        got = await exchange(purl, [get("/a"), get("/b")])
    assert [status for status, _h, _b in got] == [200, 200]
    assert len(conns) == 1
