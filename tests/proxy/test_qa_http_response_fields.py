"""Response fields at the socket level, compared with what the upstream itself sent: the
proxy passes the upstream's head on and adds only what it must (framing, ``Date``)."""

from __future__ import annotations

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import exchange, get, raw_upstream

_UNTYPED = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("framing", sorted(_UNTYPED))
async def test_a_body_without_content_type_gets_none_added(framing: str) -> None:
    """RFC 9110 8.3: without ``Content-Type`` the recipient may sniff the content or take
    it as ``application/octet-stream`` — its choice. The proxy wrote ``Content-Type:
    application/octet-stream`` into every such answer (as aiohttp's response would), so a
    client saw a field the upstream never sent, and one that rules out sniffing (a
    browser downloads what it would have shown). Both ways in: cold (aiohttp's path) and
    warm (served directly)."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return _UNTYPED[framing]

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url) as (proxy, purl, _r):
        got = await exchange(purl, [get("/a"), get("/b")])
        assert proxy.direct_starts == 1
    for status, headers, body in got:
        assert (status, body) == (200, b"hello")
        assert "content-type" not in headers, headers
        assert "date" in headers  # (a proxy adds Date when the upstream sent none)


async def test_the_upstreams_content_type_passes_unchanged() -> None:
    """The other side: a Content-Type the upstream sent is the one the client gets."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return (b"HTTP/1.1 200 OK\r\ncontent-type: Text/Plain; charset=latin-1\r\n"
                b"Content-Length: 2\r\n\r\nok")

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [get("/a"), get("/b")])
    assert [h["content-type"] for _, h, _ in got] == ["Text/Plain; charset=latin-1"] * 2
