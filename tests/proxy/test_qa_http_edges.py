"""HTTP edge cases at the socket level, each compared with what the upstream itself sends or
what the proxy does for the same bytes another way: a 304's ``Content-Length``, and request
heads that aiohttp's parser refuses whichever way the proxy happens to read them."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import OK, exchange, get, proxy_error, raw_upstream


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


async def _prime(purl: str) -> None:
    """Leave a pooled upstream connection idle, so that a request arriving whole in one
    read is served directly (without aiohttp's parser) if it may be."""
    assert (await exchange(purl, [get("/prime")]))[0][0] == 200


@pytest.mark.parametrize(
    ("request_bytes", "why"),
    [
        (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n", "8190"),
        (b"GET /x?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "8190"),
        (b"GET /x HTTP/1.1\r\nHost: x\r\n"
         + b"".join(b"X-H-%d: %d\r\n" % (i, i) for i in range(200)) + b"\r\n",
         "Too many headers"),
    ],
    ids=["long-field", "long-target", "200-fields"],
)
async def test_a_head_aiohttp_refuses_is_refused_with_a_warm_pool_too(
        request_bytes: bytes, why: str) -> None:
    """A request head over aiohttp's limits (a field or target over 8190 bytes, more than
    128 fields) is answered 400 by aiohttp's parser. The same bytes arriving in one read
    while an upstream connection was idle were served directly instead, so one request
    got 400 or the upstream's answer by how warm the pool was (a field of 10,000 bytes
    and 200 fields reached the upstream)."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (proxy, purl, _r):
        (cold,) = await exchange(purl, [request_bytes])
        await _prime(purl)
        (warm,) = await exchange(purl, [request_bytes])
        await _prime(purl)
        assert proxy.direct_starts >= 1  # a plain request on a warm pool still goes direct
    for resp in (cold, warm):
        assert resp[0] == 400, resp
        message = proxy_error(resp)
        assert message.startswith("llmtop: bad request: ") and why in message
        assert json.loads(resp[2])["error"]["code"] == "bad_request"
    assert [h.split(b" ", 2)[1] for h in heads] == [b"/prime", b"/prime"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8183 + b"\r\n\r\n",
        b"GET /x HTTP/1.1\r\n" + b"".join(b"X-H-%d: %d\r\n" % (i, i) for i in range(127))
        + b"Host: x\r\n\r\n",
    ],
    ids=["8190-byte-field", "128-fields"],
)
async def test_a_head_just_within_aiohttp_limits_is_still_served_directly(
        request_bytes: bytes) -> None:
    """The other side of the limits: a field line of 8,190 bytes and 128 fields pass
    aiohttp's parser, and on a warm pool are still served directly."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (proxy, purl, _r):
        await _prime(purl)
        before = proxy.direct_starts
        (warm,) = await exchange(purl, [request_bytes])
        assert proxy.direct_starts == before + 1
    assert warm[0] == 200
    assert len(heads) == 2 and len(heads[1]) > len(request_bytes) - 100  # all of it went


async def _stalled_reader(url: str, stall_s: float) -> int:
    """POST a stream request, read the response head, read nothing for ``stall_s``, then
    read on until the connection closes; returns the body bytes read (a small receive
    buffer, so the proxy's writes back up at once)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    r, w = await asyncio.open_connection(sock=sock, limit=1 << 16)
    body = b'{"model":"m","stream":true}'
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body)
    got = 0
    try:
        async with asyncio.timeout(20):
            await r.readuntil(b"\r\n\r\n")
            await asyncio.sleep(stall_s)
            while data := await r.read(1 << 20):
                got += len(data)
    finally:
        w.close()
    return got


async def test_a_client_that_stops_reading_is_not_recorded_as_an_idle_upstream() -> None:
    """A client that reads nothing for ``idle_s`` while the upstream has more to send: the
    proxy stops reading the upstream until the client drains (flow control), so the
    upstream is never idle — the client is. The stream was cut and recorded ``timeout``,
    ``upstream idle for 1 s mid-response``, counted against the engine; it is cut all the
    same (as nginx's ``send_timeout`` does) but recorded as the client's: ``cancelled``,
    ``client stopped reading for 1 s``. Both ways in: cold (aiohttp's path) and warm (served
    directly)."""
    event = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    big = event * (16 * 1024 * 1024 // len(event))  # (more than the sockets' buffers hold)
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(big))

    async def respond(request: bytes, _n: int) -> bytes:
        return OK if request.startswith(b"GET") else head + big

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url, timeouts__idle_s=1.0, inject_usage=False) as (proxy, purl, recs):
        got = [await _stalled_reader(purl, 3.0)]
        await _prime(purl)
        got.append(await _stalled_reader(purl, 3.0))
        records = await recs.wait(2)
        assert proxy.direct_starts >= 1
    assert all(0 < n < len(big) for n in got), got  # cut off after the stall
    for rec in records:
        assert (rec.status, rec.outcome, rec.error) == (
            200, "cancelled", "client stopped reading for 1 s"), rec


async def test_a_client_that_never_reads_is_let_go_when_its_stream_is_cut() -> None:
    """A client that reads nothing at all (not even the head) and keeps its connection
    open: after ``idle_s`` its stream is cut (recorded as its own stall), and its
    connection must go with it. It was closed gracefully, which waits until the buffered
    response has been written — never, to a client that does not read — so each such
    client kept a connection and a few hundred KB of response in the proxy until it
    closed. Both ways in: cold (aiohttp's path) and warm (served directly)."""
    event = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    big = event * (16 * 1024 * 1024 // len(event))
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(big))

    async def respond(request: bytes, _n: int) -> bytes:
        return OK if request.startswith(b"GET") else head + big

    body = b'{"model":"m","stream":true}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(body) + body)
    loop = asyncio.get_running_loop()
    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url, timeouts__idle_s=1.0, inject_usage=False) as (proxy, purl, recs):
        host, port = purl.removeprefix("http://").split(":")
        runner = proxy._runner
        assert runner is not None and runner.server is not None
        for warm in (False, True):
            if warm:
                await _prime(purl)
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await loop.sock_connect(sock, (host, int(port)))
                await loop.sock_sendall(sock, request)
                (rec,) = (await recs.wait(1 + warm, within_s=10))[warm:]
                assert (rec.outcome, rec.error) == (
                    "cancelled", "client stopped reading for 1 s"), rec
                for _ in range(100):  # within 2 s (the client still holds its end)
                    if not runner.server.connections:
                        break
                    await asyncio.sleep(0.02)
                assert not runner.server.connections
        assert proxy.direct_starts >= 1
