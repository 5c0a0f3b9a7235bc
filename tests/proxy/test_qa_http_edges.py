"""HTTP edge cases at the socket level, each compared with what the upstream itself sends or
what the proxy does for the same bytes another way: a 304's ``Content-Length``."""

from __future__ import annotations

import asyncio

from test_proxy_support import running_proxy
from test_qa_hostile import OK, get, raw_upstream


async def _bodiless_then_ok(url: str, requests: list[bytes]) -> list[bytes]:
    """Send ``requests`` on one connection, one after the other; each but the last is
    answered with no body whatever its head says, the last with ``ok``. Returns each
    response as it came off the wire."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    out: list[bytes] = []
    try:
        async with asyncio.timeout(5):
            for i, req in enumerate(requests):
                w.write(req)
                await w.drain()
                head = await r.readuntil(b"\r\n\r\n")
                out.append(head + (await r.readexactly(2) if i == len(requests) - 1 else b""))
    finally:
        w.close()
    return out


async def test_304_keeps_the_content_length_the_upstream_gave_it() -> None:
    """RFC 9110 8.6: a 304 may carry the Content-Length of the 200 it stands for (caches
    read it); it has no body all the same. The proxy kept it on a HEAD answer but dropped
    it from a 304, so the client saw other headers than the upstream sent."""
    not_modified = (b'HTTP/1.1 304 Not Modified\r\nETag: "a"\r\nContent-Length: 5\r\n'
                    b"Content-Type: text/plain\r\n\r\n")

    async def respond(head: bytes, _n: int) -> bytes:
        return not_modified if b"If-None-Match" in head else OK

    conditional = b'GET /x HTTP/1.1\r\nHost: x\r\nIf-None-Match: "a"\r\n\r\n'
    async with raw_upstream(respond) as (url, heads, conns), \
            running_proxy(url) as (proxy, purl, _r):
        # cold (aiohttp's path), then warm (served directly), then a plain GET after it on
        # the same connection: the 304 had no body, so the 200 is read whole after it
        got = await _bodiless_then_ok(purl, [conditional, conditional, get("/x")])
        assert proxy.direct_starts >= 1  # (both ways in were taken)
    for head in got[:2]:
        assert head.startswith(b"HTTP/1.1 304 Not Modified\r\n"), head
        assert b"\r\nContent-Length: 5\r\n" in head and b'\r\nETag: "a"\r\n' in head
        assert b"Transfer-Encoding" not in head
    assert got[2].startswith(b"HTTP/1.1 200 OK\r\n") and got[2].endswith(b"\r\n\r\nok")
    assert len(heads) == 3 and len(conns) == 1  # one upstream connection, kept
